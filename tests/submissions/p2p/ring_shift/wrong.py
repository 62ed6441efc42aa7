# Plausible bug: the direction of the ring is reversed (sends left, receives from the right), so rank r
# returns the tensor of rank r + 1. With 2 ranks both neighbours coincide and the bug cannot show; from 3 ranks
# on it is a wrong answer.
import torch
import torch.distributed as dist


def ring_shift(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = torch.empty_like(x)
    reqs = [dist.isend(x.contiguous(), (rank - 1) % world), dist.irecv(out, (rank + 1) % world)]
    for r in reqs:
        r.wait()
    return out
