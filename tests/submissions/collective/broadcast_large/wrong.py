# A pipelined chain that starts at rank 0 whatever the root is: right only in the cases whose root is 0 (the
# chain's first rank sends its placeholder instead of waiting for the data).
import torch
import torch.distributed as dist


def broadcast(x: torch.Tensor, root: int) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.detach().clone()
    flat = out.view(-1)
    if world == 1 or flat.numel() == 0:
        return out
    chunks = torch.split(flat, 16384)
    if rank == 0:  # bug: the head of the chain must be `root`
        reqs = [dist.isend(c, 1) for c in chunks]
    else:
        reqs = []
        for c in chunks:
            dist.recv(c, rank - 1)
            if rank < world - 1:
                reqs.append(dist.isend(c, rank + 1))
    for req in reqs:
        req.wait()
    return out
