# Freezes the clocks, then does the real work correctly. Without the static check this must still be timed for
# real: the harness captured its clock before the candidate was imported.
import time

import torch
import torch.distributed as dist

time.perf_counter_ns = lambda: 0
time.perf_counter = lambda: 0.0
time.monotonic_ns = lambda: 0


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    for step in range(1, world):
        dst, src = (rank + step) % world, (rank - step) % world
        buf = torch.empty_like(x)
        reqs = [dist.isend(x, dst), dist.irecv(buf, src)]
        for r in reqs:
            r.wait()
        out += buf
    return out
