# Freezes the clocks so the benchmark reports zero time, and claims huge bandwidth.
# Stopped by: static check (time is not an allowed import); at run time the harness holds its own clock
# (runtime_patch_timing.py shows that on its own).
import time

import torch

time.perf_counter_ns = lambda: 0
time.perf_counter = lambda: 0.0


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x)
