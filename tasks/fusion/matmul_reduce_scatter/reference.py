import torch
import torch.distributed as dist


def matmul_reduce_scatter(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    m = a.shape[0] // world
    a_blocks = a.view(world, m, a.shape[1]) if a.is_contiguous() else a.reshape(world, m, a.shape[1])
    right, left = (rank + 1) % world, (rank - 1) % world
    # ring: at step s this rank works on row block c = rank - s - 1. Block c starts on rank c + 1 and travels
    # right, every rank adding its own a[c] @ b, until it reaches its owner c at step world - 1.
    # The next block's matmul runs while the running sum travels. The send and the receive of a step go out as
    # one batch (NCCL issues it as one group, so the ring cannot deadlock).
    acc = torch.matmul(a_blocks[(rank - 1) % world], b)
    for step in range(1, world):
        incoming = torch.empty_like(acc)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, acc, right), dist.P2POp(dist.irecv, incoming, left)])
        nxt = torch.matmul(a_blocks[(rank - step - 1) % world], b)   # overlaps the transfer
        for r in reqs:
            r.wait()   # also completes the send of acc, which is not touched again
        nxt += incoming
        acc = nxt
    return acc
