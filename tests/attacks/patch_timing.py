# Freezes the clocks so the benchmark reports zero time, and claims huge bandwidth.
# Stopped by: static check (time is not an allowed import); at run time the harness holds its own clock.
import time

import torch
import torch.distributed as dist

time.perf_counter_ns = lambda: 0
time.perf_counter = lambda: 0.0


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    world = dist.get_world_size()
    bufs = [torch.empty_like(x) for _ in range(world)]
    for peer in range(world):
        if peer != dist.get_rank():
            dist.send(x, peer) if dist.get_rank() < peer else None
    return out
