"""The bounds the verdicts apply (generator-bound, behind schedule), in one module that imports nothing.

The glossary quotes them in its definitions and `analysis.generator` / `analysis.schedule` apply them; both import
them from here, so neither has to import the other or the glossary for a number.
"""

from __future__ import annotations

PROBE_INTERVAL_S = 0.01  # the lag probe's sleep: 100 lag samples per second per process

# A probe that wakes more than 2 ms late at p99 means ready streams wait as long for the CPU, and every timestamp
# taken after a read is late by that wait: it would eat most of issue 8's accuracy budget (ITL error p99 <= 3 ms,
# TTFT error p99 <= 5 ms). Idle, the probe's lag was p50 0.2 ms and p99 0.6-1.0 ms on the 2-core machine this
# suite is developed on, so 2 ms is above the timer's own jitter.
LAG_BOUND_S = 0.002
# Python runs the event loop on one core: at 85 % busy it is idle only 15 % of the time, so chunks that arrive
# together queue behind each other and their stamps are late, even before the lag probe's p99 shows it.
CPU_BOUND = 0.85

# The verdict "behind schedule": the step's schedule lag p99 over lag_bound_s(rate) =
# min(LAG_CEILING_S, max(LAG_FLOOR_S, LAG_SHARE / rate)).
# - 10 % of the mean time between two arrivals: a request that is later than that no longer arrives where the
#   arrival process put it (requests bunch up), so the server is not offered the intended pattern.
# - Never below 5 ms: the lag holds gevent's timer resolution (libev waits in whole milliseconds: a wait ends
#   0-1 ms late), the event loop's own jitter (p99 up to the 2 ms generator-bound limit), Locust's task dispatch and
#   the connect made before the send stamp (~0.1-1 ms on loopback): 1-3 ms at p50 in runs against the fake server.
#   A higher rate must not flag on those.
# - Never above 50 ms: a lag that large is of the order of a TTFT, whatever the rate; it hides server latency.
LAG_SHARE = 0.10
LAG_FLOOR_S = 0.005
LAG_CEILING_S = 0.05

# The knee and the suspect steps (analysis/knee.py), tuned on disturbed step series (tests/test_knee*.py).
KNEE_GAIN = 0.10  # a later step must add more than this to move the knee (and more than the noise)
OUTLIER_MARGIN = 0.20  # how far below its neighbours' line a step must lie to be set aside
# A drift between a step's halves smaller than this is not called unstable. It equals KNEE_GAIN: a drift the knee
# rule could not tell from a flat curve cannot move a verdict either. At 5 % the demo flagged steps on a quiet
# 2-core machine (1256 -> 1163 tok/s at 1 user, 8956 -> 9839 at 16), where vLLM's own generation-token counter
# wandered as much over 10 s at a steady load; steps whose halves differ by 15-20 % are still flagged.
STABLE_TOLERANCE = KNEE_GAIN

# The roofline verdict per step (analysis/roofline.py), on DCGM's profiling ratios (0-1, time averages over the
# scrape's collection period), each judged on its 95 % interval, not its mean: a bound must clear the threshold.
# - DRAM active >= 0.5: memory-bandwidth-bound. DRAM_ACTIVE is the share of cycles the memory interface moves data,
#   which is the achieved share of the peak bandwidth. Decode kernels reach 70-90 % of peak while they run
#   (analysis/ceiling.py's gap); the engine's scheduling, sampling and launches between them leave the memory idle
#   for the rest of each step. Above half, reading memory is most of what the GPU does; below it the memory is idle
#   more often than it is used, so it cannot be what binds.
# - SM active >= 0.9: compute-bound (saturated). SM_ACTIVE is the share of time an SM has a warp resident, averaged
#   over the SMs: at 0.9 every SM has work nearly all the time. Warps waiting on memory count as active too, so
#   memory-bound decode also reads high here; that is why memory_bound asks for SM below saturation only, and
#   compute_bound for DRAM below its threshold.
# - SM active and DRAM active both < 0.5: neither. The GPU is idle more than half the time: it waits on the serving
#   engine's CPU side, the scheduler or the load itself.
# Between these bands (SM 0.5-0.9 with DRAM low, both near their limits, an interval straddling a threshold) the
# counters cannot tell, and the regime is left empty rather than guessed.
DRAM_ACTIVE_HIGH = 0.5
SM_ACTIVE_SATURATED = 0.9
GPU_ACTIVE_LOW = 0.5
# The ceiling's comparison (analysis/roofline.py ceiling_lines): the weights' share of the peak bandwidth (1 / TPOT
# p50 steps per second, each reading every weight once, over the ceiling's rate) far below the DRAM activity means
# the memory moves something else (the KV cache, activations) or the bandwidth or weight-size figure is wrong; "far"
# is under half of the DRAM activity's lower bound: a KV cache as large as the weights (long contexts at high load)
# already doubles the bytes per step, so a smaller gap is the expected KV-cache traffic.
WEIGHT_SHARE_FAR_BELOW = 0.5
