import torch
import torch.distributed as dist


def _exchange(send_buf: torch.Tensor, dst: int, recv_buf: torch.Tensor, src: int) -> None:
    """Send and receive at once; batched so NCCL pairs them without deadlocking."""
    ops = [dist.P2POp(dist.isend, send_buf, dst), dist.P2POp(dist.irecv, recv_buf, src)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


def reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    m = x.shape[0] // world
    src = x.detach().contiguous()

    def block(j):  # rows j*m:(j+1)*m: a contiguous slice, sendable as is
        return src[j * m:(j + 1) * m]

    if world == 1 or block(0).numel() == 0:
        return block(rank).clone()
    right, left = (rank + 1) % world, (rank - 1) % world
    # Step s sends the partial sum of block (rank - s - 1) and receives block (rank - s - 2), so the last step
    # (s = W - 2) receives block rank itself, which then holds the contributions of all W ranks.
    # Two buffers alternate: one is being sent while the other is being received into.
    send_buf = block((rank - 1) % world)  # step 0 sends an untouched block of x
    bufs = [torch.empty_like(send_buf), torch.empty_like(send_buf)]
    for step in range(world - 1):
        incoming = bufs[step % 2]
        _exchange(send_buf, right, incoming, left)
        incoming += block((rank - step - 2) % world)
        send_buf = incoming
    return send_buf
