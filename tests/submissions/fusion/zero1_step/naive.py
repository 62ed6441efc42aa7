# Correct but slow: all-reduces the whole gradient (twice the bytes of a reduce-scatter), then all-gathers the
# updated slices.
import torch
import torch.distributed as dist


def zero1_step(params, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    rank, world = dist.get_rank(), dist.get_world_size()
    numel = params.numel()
    c = -(-numel // world)
    a, b = min(numel, rank * c), min(numel, (rank + 1) * c)
    total = grad.clone()
    dist.all_reduce(total)
    g = total[a:b] / world
    m = beta1 * exp_avg + (1 - beta1) * g
    v = beta2 * exp_avg_sq + (1 - beta2) * g * g
    denom = (v / (1 - beta2 ** step)).sqrt() + eps
    shard = torch.zeros(c, dtype=params.dtype)
    shard[:b - a] = params[a:b] * (1 - lr * weight_decay) - lr * (m / (1 - beta1 ** step)) / denom
    full = torch.empty(world * c, dtype=params.dtype)
    dist.all_gather_into_tensor(full, shard)
    return full[:numel], m, v
