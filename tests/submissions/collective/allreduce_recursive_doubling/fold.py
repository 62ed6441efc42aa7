# Correct: recursive doubling (swap the whole vector with rank ^ 2^k and add) over the largest power of two
# P' <= W, with the W - P' excess ranks folded in first (each sends its x to a partner) and out last (the partner
# sends it the result): floor(log2 W) + 2 rounds where W is not a power of two, one or two more than needed.
import torch
import torch.distributed as dist


def _swap(t: torch.Tensor, peer: int) -> torch.Tensor:
    inc = torch.empty_like(t)
    for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, inc, peer)]):
        req.wait()
    return inc


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    acc = x.detach().reshape(-1).clone()
    if world == 1 or acc.numel() == 0:
        return acc.view(x.shape)
    p2 = 1 << (world.bit_length() - 1)
    excess = world - p2
    if rank >= p2:
        dist.send(acc, rank - p2)
        dist.recv(acc, rank - p2)
        return acc.view(x.shape)
    if rank < excess:
        inc = torch.empty_like(acc)
        dist.recv(inc, rank + p2)
        acc += inc
    d = 1
    while d < p2:
        acc += _swap(acc, rank ^ d)
        d *= 2
    if rank < excess:
        dist.send(acc, rank + p2)
    return acc.view(x.shape)
