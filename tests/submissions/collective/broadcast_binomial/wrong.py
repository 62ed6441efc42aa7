# Plausible bug: the tree is built on absolute ranks, as if the root were always rank 0 (the relative-rank
# rotation is forgotten). Correct for root 0; for any other root rank 0 spreads its NaN placeholder and the real
# root's data is overwritten by what it "receives".
import torch.distributed as dist


def broadcast(x, root):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    mask = 1
    while mask < world:
        if rank & mask:
            dist.recv(out, rank - mask)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if rank + mask < world:
            dist.send(out, rank + mask)
        mask >>= 1
    return out
