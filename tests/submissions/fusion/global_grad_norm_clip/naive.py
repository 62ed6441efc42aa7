# Correct but wasteful on GPUs: every shard is copied to float32 and flattened into one buffer before the norm.
import torch


def clip_grad_norm(grads, max_norm, all_reduce):
    acc = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    flat = torch.cat([g.reshape(-1).to(acc) for g in grads])
    sq = (flat * flat).sum().reshape(1)
    all_reduce(sq)
    total = sq.sqrt().reshape(())
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    return [(g.to(acc) * coef).to(g.dtype) for g in grads], total
