from typing import Callable

import torch
import torch.distributed as dist


def average_gradients(grads: list[torch.Tensor], bucket_bytes: int,
                      all_reduce: Callable[[torch.Tensor], None]) -> list[torch.Tensor]:
    """Pack every gradient into one flat buffer, reduce it in bucket-sized slices, and hand out views of it."""
    world = dist.get_world_size()
    if not grads:
        return []
    out: list = [None] * len(grads)
    # one flat buffer per (dtype, device), gradients in list order; with a single dtype that is one buffer and
    # exactly ceil(total_bytes / bucket_bytes) calls
    groups: dict = {}
    for i, g in enumerate(grads):
        groups.setdefault((g.dtype, g.device), []).append(i)
    for (dtype, device), idx in groups.items():
        numels = [grads[i].numel() for i in idx]
        flat = torch.empty(sum(numels), dtype=dtype, device=device)
        views = list(torch.split(flat, numels))
        for i, v in zip(idx, views):
            v.copy_(grads[i].reshape(-1))
        per_bucket = max(1, bucket_bytes // flat.element_size())
        for start in range(0, flat.numel(), per_bucket):
            chunk = flat[start:start + per_bucket]  # a contiguous view: reduced in place, no staging copy
            all_reduce(chunk)
            chunk.div_(world)
        for i, v in zip(idx, views):
            out[i] = v.view(grads[i].shape)
    return out
