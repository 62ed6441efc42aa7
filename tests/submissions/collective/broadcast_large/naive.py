# Correct but slow for large tensors: a binomial tree sends the whole tensor at every level, and without
# chunking no rank forwards anything before it has received everything.
import torch
import torch.distributed as dist


def broadcast(x: torch.Tensor, root: int) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.detach().clone() if rank == root else torch.empty_like(x)
    flat = out.view(-1)
    if world == 1 or flat.numel() == 0:
        return out
    v = (rank - root) % world
    mask = 1
    while mask < world:
        if v & mask:
            dist.recv(flat, (v - mask + root) % world)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if v + mask < world:
            dist.send(flat, (v + mask + root) % world)
        mask >>= 1
    return out
