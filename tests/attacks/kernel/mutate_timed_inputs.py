# Class 9 (input mutation during timed calls): computes the right answer, but scribbles over its input only in the
# benchmark's calls (sizes larger than any check case), so that a check of the correctness cases alone misses it.
# The coordinator compares samples of the read-only inputs after every timed call with the inputs it makes itself.
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    for step in range(1, world):
        buf = torch.empty_like(x)
        reqs = [dist.isend(x, (rank + step) % world), dist.irecv(buf, (rank - step) % world)]
        for r in reqs:
            r.wait()
        out += buf
    if x.numel() >= 16384:
        x.zero_()
    return out
