"""steps.csv's energy section (issue 35): the GPUs' energy per step from dcgm-exporter's energy counter, per output
token and per request (analysis/energy.py), last in steps.csv, after the GPU section."""

from __future__ import annotations

from .columns import CI, Column

ENERGY = "energy"  # steps.csv: joules per step, per output token and per request (issue 35), after the GPU section

_EDGES = (
    "each GPU's DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ) / 1000, its value at each edge of the measured window "
    "interpolated linearly between the scrapes around the edge, a counter reset as Prometheus' increase() (a drop: a "
    "restart from 0); an edge with no scrape beyond it extrapolated at the window's mean power when within 1.1 scrape "
    "intervals, else the GPU is left out"
)
_DONE = "the ok requests that completed inside the window (the requests of output_tokens)"

ENERGY_COLUMNS = [
    Column("energy_gpus", ENERGY, "GPUs", "GPUs whose energy counter gave the window's joules (a GPU without "
           "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, or with too few scrapes, left out); empty without any.",
           "count of gpu_key with a value", label="Energy GPUs", header="gpus", fmt="int"),
    Column("energy_j", ENERGY, "J", "Energy the GPUs drew over the step's measured window, summed over energy_gpus; "
           "empty (never 0) when no GPU exports the counter.", f"sum over the GPUs of {_EDGES}", label="Energy (J)",
           header="J", fmt="num0", metric="gpu_energy", shows="value"),
    Column("energy_per_output_token_j", ENERGY, "J/token", "Energy per output token: the GPUs' joules over the "
           "window per output token completed in it.", "energy_j / output_tokens", label="Energy per output token "
           "(J)", header="J/token", fmt="num3", metric="gpu_energy"),
    Column("energy_per_request_j", ENERGY, "J/request", f"Energy per request: the GPUs' joules over the window per "
           f"request completed in it ({_DONE}).", "energy_j / count of those requests", label="Energy per request "
           "(J)", header="J/request", fmt="num1", metric="gpu_energy"),
    Column("energy_power_w", ENERGY, "W", "Mean power per GPU from the energy counter: a cross-check of "
           "gpu_power_mean_w (the power readings' mean) that no reading between scrapes escapes.",
           "energy_j / window_s / energy_gpus", label="Power from energy (W)", header="W/GPU", fmt="num0",
           metric="gpu_power"),
    *[Column(f"energy_per_output_token_j_ci_{end}", ENERGY, "J/token", f"{word} bound of the {CI} of "
             "energy_per_output_token_j.", "(energy_j / window_s) / aggregate_tok_s_ci_high for the lower bound, / "
             "aggregate_tok_s_ci_low for the upper: the counter is exact, the tokens counted in the window are what "
             "varies; empty when the tok/s interval is", label=f"Energy per output token CI {end}", fmt="num3",
             metric="gpu_energy")
      for end, word in (("low", "Lower"), ("high", "Upper"))],
]  # fmt: skip
