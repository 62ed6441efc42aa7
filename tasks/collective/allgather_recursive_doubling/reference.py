import torch
import torch.distributed as dist


def _exchange(send_buf: torch.Tensor, dst: int, recv_buf: torch.Tensor, src: int) -> None:
    """Send and receive at once; batched so NCCL pairs them without deadlocking."""
    ops = [dist.P2POp(dist.isend, send_buf, dst), dist.P2POp(dist.irecv, recv_buf, src)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


def all_gather(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    m = x.shape[0]
    out = torch.empty((world * m, *x.shape[1:]), dtype=x.dtype, device=x.device)
    out[rank * m:(rank + 1) * m].copy_(x)
    if world == 1 or out.numel() == 0:
        return out
    if world & (world - 1):
        return _ring(out, m, rank, world)
    # Recursive doubling: before step k this rank holds blocks [base, base + d) with d = 2^k, base = rank
    # rounded down to a multiple of d; the partner rank ^ d holds the neighbouring run of d blocks. Runs are
    # contiguous rows of `out`, so both the send and the receive work in place.
    d = 1
    while d < world:
        partner = rank ^ d
        mine, theirs = (rank // d) * d, (partner // d) * d
        _exchange(out[mine * m:(mine + d) * m], partner, out[theirs * m:(theirs + d) * m], partner)
        d *= 2
    return out


def _ring(out, m, rank, world):
    """Fallback for a world size that is not a power of two: W-1 ring steps."""
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        s, r = (rank - step) % world, (rank - step - 1) % world
        _exchange(out[s * m:(s + 1) * m], right, out[r * m:(r + 1) * m], left)
    return out
