import torch
import torch.distributed as dist


def barrier() -> None:
    """Dissemination barrier: ceil(log2 n) rounds; in round k, signal rank + 2^k and wait for rank - 2^k."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return
    nccl = dist.get_backend() == "nccl"
    # No input tells the device: NCCL moves only tensors on this rank's GPU (the current device), gloo CPU ones.
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    out = torch.zeros(1, dtype=torch.uint8, device=device)
    inc = torch.empty(1, dtype=torch.uint8, device=device)
    step = 1
    while step < world:
        # Within one call every round has its own partner pair, and between a pair messages stay in order, so a
        # message of one call cannot be taken for one of the next. The signal and the wait of a round go out as
        # one batch: NCCL issues it as one group, so no rank sits in a send while its partner sits in another.
        to, frm = (rank + step) % world, (rank - step) % world
        ops = [dist.P2POp(dist.isend, out, to), dist.P2POp(dist.irecv, inc, frm)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        step *= 2
    if nccl:
        # NCCL's wait() only orders the GPU stream; the host must not leave before the messages have arrived
        torch.cuda.current_stream().synchronize()
