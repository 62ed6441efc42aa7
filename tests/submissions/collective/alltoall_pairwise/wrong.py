# Plausible bug: the W - 1 exchange steps are right, but the rank's own block (j = rank), which never travels,
# is never copied into the result: that block stays zero.
import torch
import torch.distributed as dist


def all_to_all(x):
    rank, world = dist.get_rank(), dist.get_world_size()
    m = x.shape[0] // world
    out = torch.zeros_like(x)
    for s in range(1, world):
        dst, src = (rank + s) % world, (rank - s) % world
        reqs = [dist.isend(x[dst * m:(dst + 1) * m].contiguous(), dst),
                dist.irecv(out[src * m:(src + 1) * m], src)]
        for r in reqs:
            r.wait()
    return out  # BUG: out[rank * m:(rank + 1) * m] should be x[rank * m:(rank + 1) * m]
