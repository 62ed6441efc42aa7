# Correct but slow on this cluster: every rank posts its block straight to all W - 1 peers at once. The W - 1
# messages serialise on the sender's port (8 us each): 59 us at W = 8, against ceil(log2 W) steps of 11 us.
import torch
import torch.distributed as dist


def all_gather(x):
    rank, world = dist.get_rank(), dist.get_world_size()
    m = x.shape[0]
    out = torch.empty((world * m, *x.shape[1:]), dtype=x.dtype)
    out[rank * m:(rank + 1) * m] = x
    if x.numel() == 0:
        return out
    mine = x.contiguous()
    ops = []
    for p in range(world):
        if p != rank:
            ops.append(dist.P2POp(dist.isend, mine, p))
            ops.append(dist.P2POp(dist.irecv, out[p * m:(p + 1) * m], p))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return out
