import torch
import torch.distributed as dist


def allgather_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    m = x.shape[0]
    out = x.new_empty((world * m, w.shape[1]))
    blocks = out.view(world, m, w.shape[1])
    cur = x.contiguous()
    right, left = (rank + 1) % world, (rank - 1) % world
    # ring: at step s this rank holds x of rank (rank - s); it forwards that block to the right while it
    # multiplies it, and receives the next one from the left. The send and the receive of a step go out as one
    # batch (NCCL issues it as one group, so the ring cannot deadlock); the matmul runs while they are in flight.
    for step in range(world):
        reqs = []
        nxt = None
        if step < world - 1:
            nxt = torch.empty_like(cur)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, cur, right), dist.P2POp(dist.irecv, nxt, left)])
        torch.matmul(cur, w, out=blocks[(rank - step) % world])
        for r in reqs:
            r.wait()
        cur = nxt
    return out
