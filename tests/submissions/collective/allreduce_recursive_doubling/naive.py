# Correct and simple: every rank sends its whole tensor to every other rank at once and adds what it receives.
# One round, but W - 1 messages through each sender's port: at 8 us a message that is slow beyond 3 ranks.
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = x.detach().reshape(-1).clone()
    if world == 1 or flat.numel() == 0:
        return flat.view(x.shape)
    bufs = [torch.empty_like(flat) for _ in range(world - 1)]
    ops = []
    for s in range(1, world):
        ops.append(dist.P2POp(dist.isend, flat, (rank + s) % world))
        ops.append(dist.P2POp(dist.irecv, bufs[s - 1], (rank - s) % world))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    out = flat.clone()
    for b in bufs:
        out += b
    return out.view(x.shape)
