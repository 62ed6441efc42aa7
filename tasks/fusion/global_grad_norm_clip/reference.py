from typing import Callable

import torch


def clip_grad_norm(grads: list[torch.Tensor], max_norm: float,
                   all_reduce: Callable[[torch.Tensor], None]) -> tuple[list[torch.Tensor], torch.Tensor]:
    # accumulate in float32 at least (float64 if any shard is float64): bfloat16 sums keep 8 bits
    acc = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    device = grads[0].device
    # one norm per shard, each computed in `acc` straight from the shard (no upcast copy), then one sum
    norms = torch.stack([torch.linalg.vector_norm(g, 2, dtype=acc) for g in grads])
    sq = norms.square().sum().reshape(1)
    all_reduce(sq)  # the one cross-rank step: a single scalar
    total = sq.sqrt().reshape(())
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return [(g * coef).to(g.dtype) if g.dtype != acc else g * coef for g in grads], total
