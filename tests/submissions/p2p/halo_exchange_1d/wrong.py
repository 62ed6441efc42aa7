# Plausible bug: the edges go to the wrong neighbours. Each rank sends its FIRST h cells to the right and its
# LAST h cells to the left, so the left halo holds the left neighbour's first cells instead of its last ones.
# Message sizes still match, so nothing crashes: the values are simply wrong (whenever h < n).
import torch
import torch.distributed as dist


def halo_exchange(local, halo):
    rank, world = dist.get_rank(), dist.get_world_size()
    n, h = local.shape[0], halo
    left, right = (rank - 1) % world, (rank + 1) % world
    out = torch.empty(n + 2 * h, dtype=local.dtype)
    out[h:h + n] = local
    if h == 0:
        return out
    reqs = [dist.isend(local[:h].contiguous(), right, tag=0),
            dist.isend(local[n - h:].contiguous(), left, tag=1),
            dist.irecv(out[:h], left, tag=0),
            dist.irecv(out[h + n:], right, tag=1)]
    for r in reqs:
        r.wait()
    return out
