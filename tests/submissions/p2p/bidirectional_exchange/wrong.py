# Plausible bug: a rank without a partner "receives nothing" and returns an empty buffer of zeros instead of its
# own tensor. Every paired rank is right, so the cases where every rank has a partner pass.
import torch
import torch.distributed as dist


def exchange(x, partner):
    out = torch.zeros_like(x)
    if partner < 0 or x.numel() == 0:
        return out
    ops = [dist.P2POp(dist.isend, x.contiguous(), partner), dist.P2POp(dist.irecv, out, partner)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return out
