import torch
import torch.distributed as dist


def barrier() -> None:
    """Dissemination barrier: ceil(log2 n) rounds; in round k, signal rank + 2^k and wait for rank - 2^k."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    out = torch.zeros(1, dtype=torch.uint8, device=device)
    inc = torch.empty(1, dtype=torch.uint8, device=device)
    step = 1
    while step < world:
        # Within one call every round has its own partner pair, and between a pair messages stay in order, so a
        # message of one call cannot be taken for one of the next.
        to, frm = (rank + step) % world, (rank - step) % world
        if to == frm and rank > to:
            # same peer both ways (step = world / 2): the higher rank receives first, so that backends that run
            # one pair's operations in issue order (NCCL) do not have both sides waiting in send
            reqs = [dist.irecv(inc, frm), dist.isend(out, to)]
        else:
            reqs = [dist.isend(out, to), dist.irecv(inc, frm)]
        for req in reqs:
            req.wait()
        step *= 2
    if nccl:
        # NCCL's wait() only orders the GPU stream; the host must not leave before the messages have arrived
        torch.cuda.current_stream().synchronize()
