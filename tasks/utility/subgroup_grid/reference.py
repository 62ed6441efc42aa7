import torch
import torch.distributed as dist

_GROUPS: dict = {}

# A ring all-reduce over p ranks takes 2(p - 1) message latencies and moves 2(p - 1)/p of the tensor; an
# all-gather followed by a local reduction takes p - 1 latencies and moves p - 1 tensors. At 2 us per message and
# 370 GB/s per port the all-gather is faster below ALPHA_BYTES * p / (p - 2) bytes (always when p = 2).
ALPHA_BYTES = 740_000


def _groups(world: int, tp: int, rank: int):
    """This rank's (TP group, DP group), made once per grid. new_group is collective over the whole world, so
    every rank makes every group, in the same order, and keeps the two it belongs to."""
    key = (world, tp)
    if key not in _GROUPS:
        tp_group = dp_group = None
        for d in range(world // tp):
            g = dist.new_group(list(range(d * tp, d * tp + tp)))
            if rank // tp == d:
                tp_group = g
        for t in range(tp):
            g = dist.new_group(list(range(t, world, tp)))
            if rank % tp == t:
                dp_group = g
        _GROUPS[key] = (tp_group, dp_group)
    return _GROUPS[key]


def _reduce(x: torch.Tensor, size: int, group, op: str) -> torch.Tensor:
    """Sum or max of x over a group of `size` ranks, by all-reduce or by all-gather, whichever is faster."""
    flat = x.detach().reshape(-1).contiguous()
    nbytes = flat.numel() * flat.element_size()
    if size == 2 or nbytes * (size - 2) < ALPHA_BYTES * size:
        parts = flat.new_empty(size * flat.numel())
        dist.all_gather_into_tensor(parts, flat, group=group)
        parts = parts.view(size, -1)
        out = parts.sum(0, dtype=x.dtype) if op == "sum" else parts.amax(0)
    else:
        out = flat.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=group)
    return out.view(x.shape)


def grid_reduce(x: torch.Tensor, tp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dp_size = world // tp_size
    if x.numel() == 0:  # every rank sees the same shape: all skip alike
        return x.detach().clone(), x.detach().clone()
    tp_group, dp_group = _groups(world, tp_size, rank)
    # one reduction after the other: both need this rank's port, so running them at once gains nothing
    tp_sum = _reduce(x, tp_size, tp_group, "sum") if tp_size > 1 else x.detach().clone()
    dp_max = _reduce(x, dp_size, dp_group, "max") if dp_size > 1 else x.detach().clone()
    return tp_sum, dp_max
