"""What running candidate code on its own thread costs, measured side by side in one run.

Candidate calls run on a thread of their own (commbench_env/judge/candidate/candidate_thread.py), so each call costs two
thread hand-offs; after the last call of a timed window (once its clock has stopped) the harness settles its
namespaces (integrity.py). This prints,
per call, a direct call against a call through the candidate thread (with and without settling), for an empty job
and, where a GPU is present, for a small kernel launch; and the time of one settle on its own.

    python benchmarks/candidate_call_overhead.py [--calls 5000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch

from commbench_env.judge.candidate import candidate_thread, integrity


def per_call_us(fn: Callable[[], Any], calls: int, repeats: int = 5) -> float:
    """Median over `repeats` loops of the mean time per call."""
    means = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        means.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return statistics.median(means)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    settle = integrity.snapshot()
    run = candidate_thread.start("bench.py", settle)
    jobs: dict[str, Callable[[], Any]] = {"empty job": lambda: None}
    if torch.cuda.is_available():
        x = torch.ones(1024, device="cuda")
        run(lambda: torch.cuda.set_device(0))
        jobs["torch add_ on 4 KiB (GPU)"] = lambda: x.add_(1)
    print(f"{args.calls} calls per loop, median of 5 loops; microseconds per call")
    print(f"{'job':28} {'direct':>8} {'thread':>8} {'thread+settle':>14}")
    for name, job in jobs.items():
        direct = per_call_us(job, args.calls)
        threaded = per_call_us(lambda: run(job), args.calls)
        settled = per_call_us(lambda: (run(job), settle()), max(1, args.calls // 10))
        print(f"{name:28} {direct:8.2f} {threaded:8.2f} {settled:14.2f}")
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    print(f"one settle alone: {per_call_us(settle, 200):.0f} us")


if __name__ == "__main__":
    main()
