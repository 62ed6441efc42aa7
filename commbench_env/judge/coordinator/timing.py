"""Bounds on the figures the coordinator cannot take itself: GPU timings read inside a candidate process.

On the CPU the coordinator times every call with its own clock (release to samples). On a GPU the ranks' CUDA
events time the calls, and those events are read in a process candidate code shares; so they are checked twice
from outside: from below by the coordinator's clock around the calls (`bounded_times`), and from above by the
roofline measured before any candidate code ran (`implausible_timing`).
"""

from __future__ import annotations

from typing import Any

from .links import RankFailure

IMPLAUSIBLE_ROOFLINE_PCT = 300.0  # honest references peak near 105 % of the roofline the judge measures
IMPLAUSIBLE_MIN_BYTES = 1 << 20  # below this, latency dominates and no roofline applies
# What the GPU start line (syncs, the L2 reset, about 3 ms of warm-up, the device host's gate and threads) and the
# messages around the timed calls may take beyond the calls themselves. A rank's own timings may not claim less
# than GPU_BOUND_SHARE of the coordinator's window beyond this slack: a bound against forged figures, loose enough
# that host noise never raises an honest one (it bites only where calls take far longer than the slack).
GPU_START_SLACK_NS = 20_000_000
GPU_BOUND_SHARE = 0.5


def clock_floor(window_ns: int) -> int:
    """The least total a rank's own GPU timings may report for calls the coordinator saw take `window_ns`."""
    return int(GPU_BOUND_SHARE * (window_ns - GPU_START_SLACK_NS))


def bounded_times(who: str, ns: Any, calls: int, window_ns: int, case: str) -> tuple[list[int], bool]:
    """A process's own GPU timings of `calls` calls, checked and raised (proportionally) to `clock_floor` of the
    coordinator's window around them if they sum to less; returns them and whether they were raised."""
    if not isinstance(ns, list) or len(ns) != calls or not all(type(x) is int and x >= 0 for x in ns):
        raise RankFailure.protocol(who, "bad call times", case)
    floor, total = clock_floor(window_ns), sum(ns)
    if total >= floor:
        return ns, False
    return ([int(x * floor / total) for x in ns] if total else [floor // calls] * calls), True


def implausible_timing(roofline_pct: float | None, size_bytes: int, roofline_name: str) -> str | None:
    """Why a bandwidth is impossible, or None: a figure far above the roofline measured in the same evaluation
    means the clock was fooled, whatever the rank reported."""
    if roofline_pct is None or size_bytes < IMPLAUSIBLE_MIN_BYTES or roofline_pct <= IMPLAUSIBLE_ROOFLINE_PCT:
        return None
    return (f"measured {roofline_pct:.0f} % of the {roofline_name} roofline at {size_bytes} bytes; no transfer is "
            f"{IMPLAUSIBLE_ROOFLINE_PCT / 100:.0f}x faster than the hardware allows, so this timing cannot be right")
