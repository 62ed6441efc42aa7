from typing import Callable

import torch


def clip_grad_norm(grads: list[torch.Tensor], max_norm: float,
                   all_reduce: Callable[[torch.Tensor], None]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """grads: this rank's gradient shards (the shards of all ranks together are the model's gradients).
    Return (clipped shards, same order, shapes and dtypes; total_norm, a 0-d tensor): the global L2 norm of all
    ranks' shards, and every shard scaled by min(1, max_norm / (total_norm + 1e-6)). Call all_reduce exactly once."""
    raise NotImplementedError
