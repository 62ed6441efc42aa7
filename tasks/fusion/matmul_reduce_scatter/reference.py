import torch
import torch.distributed as dist


def matmul_reduce_scatter(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    m = a.shape[0] // world
    a_blocks = a.view(world, m, a.shape[1]) if a.is_contiguous() else a.reshape(world, m, a.shape[1])
    right, left = (rank + 1) % world, (rank - 1) % world
    # ring: at step s this rank works on row block c = rank - s - 1. Block c starts on rank c + 1 and travels
    # right, every rank adding its own a[c] @ b, until it reaches its owner c at step world - 1.
    # The next block's matmul runs while the running sum travels.
    acc = torch.matmul(a_blocks[(rank - 1) % world], b)
    send_req = None
    for step in range(1, world):
        if send_req is not None:
            send_req.wait()
        incoming = torch.empty_like(acc)
        sending = acc                       # keep the buffer alive until its send completes
        send_req = dist.isend(sending, right)
        recv_req = dist.irecv(incoming, left)
        acc = torch.matmul(a_blocks[(rank - step - 1) % world], b)   # overlaps the transfer
        recv_req.wait()
        acc += incoming
    if send_req is not None:
        send_req.wait()
    return acc
