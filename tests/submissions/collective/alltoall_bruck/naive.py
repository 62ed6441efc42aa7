# Correct but slow on this cluster: every block goes straight to its rank, all W - 1 sends and receives posted at
# once. The W - 1 messages serialise on the sender's port (8 us each): 59 us at W = 8, against ceil(log2 W)
# steps of 11 us.
import torch
import torch.distributed as dist


def all_to_all(x):
    rank, world = dist.get_rank(), dist.get_world_size()
    m = x.shape[0] // world
    src = x.contiguous()
    out = torch.empty_like(src)
    out[rank * m:(rank + 1) * m] = src[rank * m:(rank + 1) * m]
    if out.numel() == 0:
        return out
    ops = []
    for p in range(world):
        if p != rank:
            ops.append(dist.P2POp(dist.isend, src[p * m:(p + 1) * m], p))
            ops.append(dist.P2POp(dist.irecv, out[p * m:(p + 1) * m], p))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return out
