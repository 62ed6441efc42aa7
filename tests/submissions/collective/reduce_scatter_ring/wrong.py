# Plausible bug: the textbook ring schedule copied from all-reduce (step s sends block rank - s), which leaves
# the fully reduced block (rank + 1) % W on this rank, but the function returns block `rank`, which holds only
# a partial sum. Off by one in the chunk index: every value is wrong.
import torch
import torch.distributed as dist


def reduce_scatter(x):
    rank, world = dist.get_rank(), dist.get_world_size()
    m = x.shape[0] // world
    chunks = [c.clone() for c in x.split(m)] if m else [x[:0].clone() for _ in range(world)]
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        s, r = (rank - step) % world, (rank - step - 1) % world
        buf = torch.empty_like(chunks[r])
        reqs = [dist.isend(chunks[s], right), dist.irecv(buf, left)]
        for q in reqs:
            q.wait()
        chunks[r] += buf
    return chunks[rank]  # BUG: the complete sum is in chunks[(rank + 1) % world]
