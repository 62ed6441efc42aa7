import torch
import torch.distributed as dist


def allgather_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Return cat(x_0, ..., x_{W-1}) @ w: row block s of the result is rank s's x times this rank's w."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if x.dim() != 2 or w.dim() != 2:
        raise NotImplementedError("x must be [m, k] and w [k, n]")
    m = x.shape[0]
    out = x.new_empty((world * m, w.shape[1]))
    blocks = out.view(world, m, w.shape[1])
    right, left = (rank + 1) % world, (rank - 1) % world
    # Ring with two buffers that take turns: in step s this rank holds rank (rank - s)'s block in one buffer,
    # forwards it to the right and multiplies it, while the next block arrives from the left in the other.
    # The transfer of a step is waited for one step later, so that it overlaps a whole matmul.
    bufs = [x.contiguous().clone(), torch.empty_like(x)]
    pending = []
    for step in range(world):
        cur, nxt = bufs[step % 2], bufs[(step + 1) % 2]
        started = []
        if step < world - 1:
            started = dist.batch_isend_irecv([dist.P2POp(dist.isend, cur, right),
                                              dist.P2POp(dist.irecv, nxt, left)])
        torch.matmul(cur, w, out=blocks[(rank - step) % world])
        for req in pending:  # the previous step's transfer
            req.wait()
        pending = started
    for req in pending:
        req.wait()
    return out
