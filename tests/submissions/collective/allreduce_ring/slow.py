# Correct but slow: gathers everything on rank 0 one message at a time, sums, then sends the result back
# one rank at a time. Twice the latency chain of the ring and all traffic through one rank.
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        total = x.clone()
        buf = torch.empty_like(x)
        for src in range(1, world):
            dist.recv(buf, src)
            total += buf
        for dst in range(1, world):
            dist.send(total, dst)
        return total
    dist.send(x, 0)
    out = torch.empty_like(x)
    dist.recv(out, 0)
    return out
