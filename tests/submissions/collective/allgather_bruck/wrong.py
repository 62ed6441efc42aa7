# Plausible bug: Bruck's log-step concatenation done right, but the final rotation goes the wrong way. Slot i of
# the buffer holds block (rank + i) % W; rolling by -rank instead of +rank is right on rank 0 only.
import torch
import torch.distributed as dist


def all_gather(x):
    rank, world = dist.get_rank(), dist.get_world_size()
    m = x.shape[0]
    buf = torch.empty((world, *x.shape), dtype=x.dtype)
    buf[0] = x
    if x.numel():
        d = 1
        while d < world:
            n = min(d, world - d)
            reqs = [dist.isend(buf[:n], (rank - d) % world), dist.irecv(buf[d:d + n], (rank + d) % world)]
            for r in reqs:
                r.wait()
            d *= 2
    return torch.roll(buf, -rank, 0).reshape(world * m, *x.shape[1:])  # BUG: should roll by +rank
