import torch
import torch.distributed as dist


def allgather_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    m = x.shape[0]
    out = x.new_empty((world * m, w.shape[1]))
    blocks = out.view(world, m, w.shape[1])
    src = x.detach().contiguous()
    if world == 1:
        torch.matmul(src, w, out=blocks[0])
        return out
    # Every rank sends its x to every peer at once, into a receive buffer of its own per peer (no buffer is the
    # target of two transfers), multiplies its own block while the others are in flight, and multiplies each
    # peer's block only after that block's receive has been waited for. x is only read by the sends, and no
    # buffer is written while a send may still read it. Each rank's port carries the same W - 1 blocks as a ring
    # would, in one message latency instead of W - 1 in a row.
    got = src.new_empty((world - 1, *src.shape))
    ops = []
    for s in range(1, world):
        ops += [dist.P2POp(dist.isend, src, (rank + s) % world),
                dist.P2POp(dist.irecv, got[s - 1], (rank - s) % world)]
    reqs = dist.batch_isend_irecv(ops)
    torch.matmul(src, w, out=blocks[rank])  # overlaps the transfers
    for s in range(1, world):
        reqs[2 * s - 1].wait()  # the receive from rank - s: its buffer is not read before this wait
        torch.matmul(got[s - 1], w, out=blocks[(rank - s) % world])
    for req in reqs[0::2]:
        req.wait()
    return out
