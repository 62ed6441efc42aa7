import torch
import torch.distributed as dist


def ring_shift(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1 or x.numel() == 0:
        # nothing to move: with one rank it is its own left neighbour; an empty tensor carries no data
        return x.detach().clone()
    right, left = (rank + 1) % world, (rank - 1) % world
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    # post the receive and the send together: no rank waits for another to finish first
    reqs = [dist.irecv(out, left), dist.isend(x.detach().contiguous(), right)]
    for r in reqs:
        r.wait()
    return out
