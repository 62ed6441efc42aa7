import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    acc = x.detach().clone().reshape(-1)
    if world == 1:
        return acc.reshape(x.shape)
    # reduce along a chain to the last rank, then broadcast back along the chain
    if rank > 0:
        buf = torch.empty_like(acc)
        dist.recv(buf, rank - 1)
        acc += buf
    if rank < world - 1:
        dist.send(acc, rank + 1)
        dist.recv(acc, rank + 1)
    if rank > 0:
        dist.send(acc, rank - 1)
    return acc.reshape(x.shape)
