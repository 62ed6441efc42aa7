# Correct but slow: the lower rank of a pair sends first and then receives, the higher one the other way round.
# No deadlock, but the two directions move one after the other: twice the time of a concurrent swap.
import torch
import torch.distributed as dist


def exchange(x, partner):
    rank = dist.get_rank()
    out = torch.empty_like(x)
    if partner < 0 or x.numel() == 0:
        return out.copy_(x)
    if rank < partner:
        dist.send(x.contiguous(), partner)
        dist.recv(out, partner)
    else:
        dist.recv(out, partner)
        dist.send(x.contiguous(), partner)
    return out
