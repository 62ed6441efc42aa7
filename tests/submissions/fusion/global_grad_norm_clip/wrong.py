# Plausible bug: every rank computes the norm of its own shards and the norms are summed across ranks. The
# global norm is the square root of the summed squares: a sum of norms overestimates it (and clips too hard).
import torch


def clip_grad_norm(grads, max_norm, all_reduce):
    acc = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    local = torch.stack([torch.linalg.vector_norm(g, 2, dtype=acc) for g in grads]).square().sum().sqrt()
    total = local.reshape(1)
    all_reduce(total)  # BUG: sums norms, not squared norms
    total = total.reshape(())
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return [(g.to(acc) * coef).to(g.dtype) for g in grads], total
