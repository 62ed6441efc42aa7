# Plausible bug: the RMSNorm statistic is taken over the whole local shard (`mean()` without `dim=-1`), one
# number for all of this rank's tokens instead of one per token. The communication is right.
import torch
import torch.distributed as dist
import torch.nn.functional as F


def tp_mlp_block(x, norm_weight, w1, w2, eps):
    world = dist.get_world_size()
    n, d = x.shape
    xf = x.double()
    h = (xf * torch.rsqrt(xf.pow(2).mean() + eps) * norm_weight.double()).to(x.dtype)
    full = torch.empty((world * n, d), dtype=x.dtype)
    dist.all_gather_into_tensor(full, h.contiguous())
    part = (F.gelu(full.double() @ w1.double()) @ w2.double()).to(x.dtype)
    mine = torch.empty((n, d), dtype=x.dtype)
    dist.reduce_scatter_tensor(mine, part.contiguous())
    return xf + mine.double()
