import torch
import torch.distributed as dist


def exchange(x: torch.Tensor, partner: int) -> torch.Tensor:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if partner < 0:  # no partner: nothing to receive
        return out.copy_(x)
    if x.numel() == 0:  # both sides know the shape: an empty swap needs no message
        return out
    # Both directions in one batch: the send leaves on this rank's egress port while the partner's message arrives
    # on its ingress port, so the swap costs one transfer, not two. Batching also pairs the two sides under NCCL
    # (each rank posts one send and one receive to the same peer), so neither order can deadlock.
    ops = [dist.P2POp(dist.isend, x.detach().contiguous(), partner),
           dist.P2POp(dist.irecv, out, partner)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return out
