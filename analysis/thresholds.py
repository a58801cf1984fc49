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
