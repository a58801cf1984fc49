"""A fake NVIDIA dcgm-exporter: GET /metrics serves DCGM's exact Prometheus text (dcgm-exporter 4.5.3-4.8.2's
rendering of its default counters, plus DCGM_FI_PROF_SM_ACTIVE) for N GPUs, with values that follow a known
schedule; GET /truth lists every answer it served (when, and each GPU's scheduled values).

The schedule is a function of the scrape's index k (0, 1, 2 ... over the answers served) and the GPU's index g, so
every value differs between scrapes and GPUs (an average taken over the wrong samples shows):
  DCGM_FI_DEV_GPU_UTIL      = (7 k + 10 g) % 101             (percent, an integer)
  DCGM_FI_PROF_SM_ACTIVE    = ((13 k + 29 g) % 97) / 100     (ratio)
  DCGM_FI_PROF_DRAM_ACTIVE  = ((17 k + 31 g) % 89) / 100     (ratio)
  DCGM_FI_DEV_FB_USED       = 70000 + 1000 g + (k % 50) * 8  (MiB, an integer)
  DCGM_FI_DEV_POWER_USAGE   = 300 + 10 g + (k % 10) * 1.25   (W; --power-w W[,W...]: constant, per GPU)
  (POST /values {"util": 87, ...} pins a field to one value for every GPU instead; {} goes back to the schedule.)
  DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ since "boot", an integer): the exact integral of the power it reports,
  each answer's watts held until the next answer (a GPU draws what it last reported), from 9e9 + g mJ at start;
  --energy-reset-after S restarts it from 0 S seconds after its first answer (a driver reload), --no-energy drops it.

Control: POST /down {"down": true} makes every scrape fail until POST /down {"down": false}.

Faults: --no-profiling leaves out every DCGM_FI_PROF_* family (a consumer GPU, or the exporter's default counters
without DCP); --blank-profiling serves them with DCGM's blank value instead (an older exporter on a GPU that does not
support them); --down-after S --down-for D: from S to S + D seconds after start, every scrape fails (--down-mode
reset: the connection closes without an answer, as a restarting exporter; http503: HTTP 503). A scrape served while
down is not in /truth.

    python tests/fakedcgm.py --port 9400 --gpus 2 --hostname node-1
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# dcgm-exporter's default counters (etc/default-counters.csv of 4.5.3-4.8.2; tests/fixtures/dcgm), with
# DCGM_FI_PROF_SM_ACTIVE enabled as the suite's deployments do: (field, type, help).
COUNTERS = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
     "Ratio of cycles the device memory interface is active sending or receiving data."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus - including both protocol "
     "headers and data payloads - in bytes per second."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus - including both protocol "
     "headers and data payloads - in bytes per second."),
]  # fmt: skip
FRAMEBUFFER_MIB = 81559  # an H100 80GB HBM3's framebuffer (used + free + reserved)
FP64_BLANK = 140737488355328.0  # DCGM_FT_FP64_BLANK (2**47), what an older exporter served for an unsupported field
INTEGER_FIELDS = {
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}  # fmt: skip
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
SCHEDULED = {
    "util": "DCGM_FI_DEV_GPU_UTIL",
    "sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "fb_used_mib": "DCGM_FI_DEV_FB_USED",
    "power_w": "DCGM_FI_DEV_POWER_USAGE",
}


def scheduled(k: int, g: int) -> dict:
    """The scheduled values of scrape k, GPU g (see the module docstring)."""
    return {
        "util": (7 * k + 10 * g) % 101,
        "sm_active": ((13 * k + 29 * g) % 97) / 100,
        "dram_active": ((17 * k + 31 * g) % 89) / 100,
        "fb_used_mib": 70000 + 1000 * g + (k % 50) * 8,
        "power_w": 300 + 10 * g + (k % 10) * 1.25,
    }


def _value(field: str, value: float) -> str:
    """As dcgm-exporter writes it: integers plainly, floats with six decimals (Go's %f)."""
    return str(int(value)) if field in INTEGER_FIELDS else f"{value:f}"


def values(k: int, cfg: argparse.Namespace, pinned: dict) -> list[dict]:
    """Each GPU's values of the scheduled fields in scrape k: the schedule, --power-w, then what POST /values pinned."""
    out = []
    for g in range(cfg.gpus):
        v = scheduled(k, g)
        if cfg.power_w:
            v["power_w"] = cfg.power_w[g % len(cfg.power_w)]
        out.append({**v, **pinned})
    return out


def render(
    k: int, cfg: argparse.Namespace, pinned: dict, energy_mj: list[float] | None = None
) -> tuple[str, list[dict]]:
    """Scrape k's text, and each GPU's values of the scheduled fields (with its energy counter in mJ)."""
    truth = []
    values_by_gpu = []
    for g, v in enumerate(values(k, cfg, pinned)):
        energy = int(energy_mj[g]) if energy_mj is not None else 9_000_000_000 + g
        v = {**v, "energy_mj": energy}
        truth.append(v)
        used = int(v["fb_used_mib"])
        values_by_gpu.append(
            {
                "DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_MEM_CLOCK": 2619, "DCGM_FI_DEV_MEMORY_TEMP": 41 + g,
                "DCGM_FI_DEV_GPU_TEMP": 52 + g, "DCGM_FI_DEV_POWER_USAGE": v["power_w"],
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": energy,
                "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0, "DCGM_FI_DEV_GPU_UTIL": v["util"],
                "DCGM_FI_DEV_MEM_COPY_UTIL": int(v["dram_active"] * 100), "DCGM_FI_DEV_ENC_UTIL": 0,
                "DCGM_FI_DEV_DEC_UTIL": 0, "DCGM_FI_DEV_XID_ERRORS": 0,
                "DCGM_FI_DEV_FB_FREE": FRAMEBUFFER_MIB - 512 - used, "DCGM_FI_DEV_FB_USED": used,
                "DCGM_FI_DEV_FB_RESERVED": 512, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 0,
                "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": min(1.0, v["util"] / 100 + 0.001),
                "DCGM_FI_PROF_SM_ACTIVE": v["sm_active"], "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": v["sm_active"] / 2,
                "DCGM_FI_PROF_DRAM_ACTIVE": v["dram_active"], "DCGM_FI_PROF_PCIE_TX_BYTES": 1_234_567 + k,
                "DCGM_FI_PROF_PCIE_RX_BYTES": 7_654_321 + k,
            }
        )  # fmt: skip
    lines = []
    for field, kind, help_text in COUNTERS:
        profiling = field.startswith("DCGM_FI_PROF_")
        if (profiling and cfg.no_profiling) or (field == ENERGY and cfg.no_energy):
            continue
        lines += [f"# HELP {field} {help_text}", f"# TYPE {field} {kind}"]
        for g in range(cfg.gpus):
            labels = (
                f'gpu="{g}",UUID="GPU-{cfg.uuid_prefix}-{g:04d}-4c1e-9b2a-00000000{g:04d}",'
                f'pci_bus_id="00000000:{0x18 + 0x10 * g:02X}:00.0",device="nvidia{g}",modelName="{cfg.model_name}"'
            )
            if cfg.hostname:
                labels += f',{cfg.hostname_label}="{cfg.hostname}"'
            labels += f',DCGM_FI_DRIVER_VERSION="{cfg.driver}"'
            value = FP64_BLANK if profiling and cfg.blank_profiling else values_by_gpu[g][field]
            lines.append(f"{field}{{{labels}}} {_value(field, value)}")
    return "\n".join(lines) + "\n", truth


class State:
    def __init__(self, cfg: argparse.Namespace) -> None:
        self.cfg = cfg
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.k = 0
        self.served: list[dict] = []
        self.failed = 0
        self.pinned: dict = {}
        self.forced_down = False  # POST /down {"down": true}
        # Each GPU's energy counter (mJ) at `energy_at` (monotonic), and the watts it draws since (its last answer's).
        self.energy_mj = [9_000_000_000.0 + g for g in range(cfg.gpus)]
        self.energy_at = self.started
        self.drawing_w: list[float] | None = None  # before the first answer: that answer's watts
        self.reset_done = cfg.energy_reset_after is None
        self.first_answer_at: float | None = None

    def advance_energy(self, now: float, power_w: list[float]) -> list[float]:
        """The energy counters at `now`: each GPU's watts held since the last answer integrated exactly (a restart
        from 0 at --energy-reset-after counts only what was drawn since); then draw `power_w` (this answer's)."""
        drawing = self.drawing_w if self.drawing_w is not None else power_w
        if self.first_answer_at is None:
            self.first_answer_at = now
        # From the first answer, not the start: a run that took long to start on a busy machine still sees it.
        reset_at = None if self.reset_done else self.first_answer_at + self.cfg.energy_reset_after
        for g, watts in enumerate(drawing):
            if reset_at is not None and reset_at <= now:
                self.energy_mj[g] = watts * (now - max(reset_at, self.energy_at)) * 1000.0
            else:
                self.energy_mj[g] += watts * (now - self.energy_at) * 1000.0
        if reset_at is not None and reset_at <= now:
            self.reset_done = True
        self.energy_at, self.drawing_w = now, list(power_w)
        return list(self.energy_mj)

    def down(self) -> bool:
        if self.forced_down:
            return True
        if self.cfg.down_after is None:
            return False
        age = time.monotonic() - self.started
        return self.cfg.down_after <= age < self.cfg.down_after + self.cfg.down_for


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: State

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        st = self.state
        if self.path == "/truth":
            with st.lock:
                body = json.dumps({"served": st.served, "failed": st.failed, "gpus": st.cfg.gpus}).encode()
            self._send(200, body, "application/json")
            return
        if self.path != "/metrics":
            self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")
            return
        if st.down():
            with st.lock:
                st.failed += 1
            if st.cfg.down_mode == "http503":
                self._send(503, b"DCGM hostengine not reachable\n", "text/plain; charset=utf-8")
            else:
                self.close_connection = True  # no answer at all: the client sees the connection close
            return
        with st.lock:
            k = st.k
            st.k += 1
            now, wall = time.monotonic(), time.time()
            energy = st.advance_energy(now, [v["power_w"] for v in values(k, st.cfg, st.pinned)])
            text, truth = render(k, st.cfg, st.pinned, energy)
            st.served.append({"served_at": wall, "k": k, "gpus": truth})
        self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/down":
            with self.state.lock:
                self.state.forced_down = bool(body.get("down", True))
            self._send(200, b"{}", "application/json")
            return
        if self.path != "/values":
            self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")
            return
        pinned = body
        unknown = set(pinned) - set(SCHEDULED)
        if unknown:
            self._send(400, f"unknown fields {sorted(unknown)}; known: {sorted(SCHEDULED)}\n".encode(), "text/plain")
            return
        with self.state.lock:
            self.state.pinned = pinned
        self._send(200, b"{}", "application/json")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed as PORT n)")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--hostname", default="gpu-node-1", help="the Hostname label ('' leaves it out, as --no-hostname)")
    p.add_argument("--hostname-label", default="Hostname", choices=["Hostname", "hostname"],
                   help="Hostname up to dcgm-exporter 4.5.3-4.8.2, hostname after")  # fmt: skip
    p.add_argument("--model-name", default="NVIDIA H100 80GB HBM3")
    p.add_argument("--uuid-prefix", default="5f3a2b1c", help="GPU UUIDs: GPU-<prefix>-<g>-...; differ per host")
    p.add_argument("--driver", default="550.54.15")
    p.add_argument("--no-profiling", action="store_true", help="leave out every DCGM_FI_PROF_* family")
    p.add_argument("--blank-profiling", action="store_true", help="serve DCGM_FI_PROF_* as DCGM's blank value")
    p.add_argument("--no-energy", action="store_true", help="leave out DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    p.add_argument("--power-w", type=lambda t: [float(w) for w in t.split(",")], default=None,
                   help="constant watts per GPU (one for all, or one per GPU): the energy's known truth")  # fmt: skip
    p.add_argument("--energy-reset-after", type=float, default=None,
                   help="seconds after start when the energy counter restarts from 0")  # fmt: skip
    p.add_argument("--down-after", type=float, default=None, help="seconds after start when scrapes begin to fail")
    p.add_argument("--down-for", type=float, default=0.0, help="seconds the scrapes fail")
    p.add_argument("--down-mode", default="reset", choices=["reset", "http503"])
    cfg = p.parse_args(argv)
    Handler.state = State(cfg)
    server = ThreadingHTTPServer((cfg.host, cfg.port), Handler)
    server.daemon_threads = True
    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
