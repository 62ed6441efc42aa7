# Plausible bug: the counts are right (tokens_per_expert is all-reduced), but the offsets are only this rank's
# local prefix sums: they forget the rows that lower ranks put ahead of this rank's tokens.
import torch
import torch.distributed as dist


def dispatch_layout(topk_idx, experts_per_rank):
    world = dist.get_world_size()
    n_exp = world * experts_per_rank
    t = topk_idx.shape[0]
    valid = topk_idx >= 0
    safe = torch.where(valid, topk_idx, n_exp)
    rows = torch.zeros((t, n_exp + 1), dtype=torch.int64, device=topk_idx.device).scatter_(1, safe, 1)[:, :n_exp]
    hits = rows.view(t, world, experts_per_rank).amax(2)
    tokens_per_expert = rows.sum(0)
    dist.all_reduce(tokens_per_expert)
    rank_offset = torch.where(hits > 0, hits.cumsum(0) - 1, -1)
    pos = rows.cumsum(0) - 1
    expert_offset = torch.where(valid, pos.gather(1, safe.clamp_max(n_exp - 1)), -1)
    return hits.sum(0), tokens_per_expert, rank_offset, expert_offset
