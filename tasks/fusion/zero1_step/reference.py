import math

import torch
import torch.distributed as dist


def zero1_step(params: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
               step: int, lr: float, beta1: float, beta2: float, eps: float,
               weight_decay: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    numel = params.numel()
    c = -(-numel // world)  # shard length: ceil(N / world); rank r owns [r*c, min(N, (r+1)*c))
    a, b = min(numel, rank * c), min(numel, (rank + 1) * c)

    # 1. reduce-scatter of the gradients: each rank ends with the sum of its own slice only. The collective needs
    #    world equal chunks, so an N that does not divide is padded (one copy); otherwise grad goes in as it is.
    if numel == world * c:
        flat = grad.reshape(-1)
    else:
        flat = torch.zeros(world * c, dtype=grad.dtype, device=grad.device)
        flat[:numel].copy_(grad.reshape(-1))
    g = torch.empty(c, dtype=grad.dtype, device=grad.device)
    dist.reduce_scatter_tensor(g, flat)
    g = g[:b - a].div_(world)

    # 2. AdamW on the owned slice (torch.optim.AdamW's arithmetic); the inputs stay untouched
    m = torch.lerp(exp_avg, g, 1 - beta1)                      # beta1 * m + (1 - beta1) * g
    v = (exp_avg_sq * beta2).addcmul_(g, g, value=1 - beta2)  # beta2 * v + (1 - beta2) * g^2
    bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
    denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
    shard = torch.zeros(c, dtype=params.dtype, device=params.device)
    shard[:b - a] = params.reshape(-1)[a:b] * (1 - lr * weight_decay)
    shard[:b - a].addcdiv_(m, denom, value=-lr / bc1)

    # 3. all-gather of the updated slices, straight into the result (its first N elements)
    full = torch.empty(world * c, dtype=params.dtype, device=params.device)
    dist.all_gather_into_tensor(full, shard)
    return full[:numel].view(params.shape), m, v
