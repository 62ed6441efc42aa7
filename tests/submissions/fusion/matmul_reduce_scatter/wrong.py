# Plausible bug: the fused ring is off by one. Block c = rank - step is started on its owner instead of
# on the owner's right neighbour, so after world - 1 hops every rank ends up holding the fully reduced
# block of its RIGHT neighbour (rank + 1) instead of its own.
import torch
import torch.distributed as dist


def matmul_reduce_scatter(a, b):
    rank, world = dist.get_rank(), dist.get_world_size()
    m = a.shape[0] // world
    a_blocks = a.reshape(world, m, a.shape[1])
    right, left = (rank + 1) % world, (rank - 1) % world
    acc = torch.matmul(a_blocks[rank], b)                          # BUG: should start with block rank - 1
    for step in range(1, world):
        incoming = torch.empty_like(acc)
        reqs = [dist.isend(acc, right), dist.irecv(incoming, left)]
        nxt = torch.matmul(a_blocks[(rank - step) % world], b)      # BUG: should be rank - step - 1
        for r in reqs:
            r.wait()
        acc = nxt + incoming
    return acc
