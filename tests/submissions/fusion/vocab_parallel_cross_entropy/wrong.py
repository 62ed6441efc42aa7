# Plausible bug: the textbook formula without the max subtraction. Exact on small logits, but exp()
# overflows to inf (and underflows to 0) as soon as logits reach the hundreds.
import torch
import torch.distributed as dist


def vocab_parallel_cross_entropy(logits_shard, targets):
    rank = dist.get_rank()
    n_rows, v = logits_shard.shape
    x = logits_shard.float() if logits_shard.dtype == torch.bfloat16 else logits_shard
    local = targets - rank * v
    mine = (local >= 0) & (local < v)
    picked = x[torch.arange(n_rows), local.clamp(0, v - 1)]
    stats = torch.stack([torch.exp(x).sum(dim=1), torch.where(mine, picked, torch.zeros_like(picked))])
    dist.all_reduce(stats)
    return torch.log(stats[0]) - stats[1]
