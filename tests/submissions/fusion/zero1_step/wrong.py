# Plausible bug: the reduce-scatter sums the gradients and the sum is used as it is: the update sees
# world_size times the mean gradient. Adam's m / sqrt(v) is nearly scale-free, but the moments are not.
import math

import torch
import torch.distributed as dist


def zero1_step(params, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    rank, world = dist.get_rank(), dist.get_world_size()
    numel = params.numel()
    c = -(-numel // world)
    a, b = min(numel, rank * c), min(numel, (rank + 1) * c)
    flat = torch.zeros(world * c, dtype=grad.dtype)
    flat[:numel] = grad
    g = torch.empty(c, dtype=grad.dtype)
    dist.reduce_scatter_tensor(g, flat)
    g = g[:b - a]  # BUG: no division by world
    m = beta1 * exp_avg + (1 - beta1) * g
    v = beta2 * exp_avg_sq + (1 - beta2) * g * g
    denom = (v / (1 - beta2 ** step)).sqrt() + eps
    shard = torch.zeros(c, dtype=params.dtype)
    shard[:b - a] = params[a:b] * (1 - lr * weight_decay) - lr * (m / (1 - beta1 ** step)) / denom
    full = torch.empty(world * c, dtype=params.dtype)
    dist.all_gather_into_tensor(full, shard)
    return full[:numel], m, v
