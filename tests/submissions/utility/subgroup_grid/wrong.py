# Plausible mistake: the grid laid out the other way round (DP rank r % D, TP groups strided), so the TP groups
# hold the wrong ranks whenever 1 < tp_size < world_size.
import torch
import torch.distributed as dist

_GROUPS: dict = {}


def grid_reduce(x: torch.Tensor, tp_size: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    dp = world // tp_size
    key = (world, tp_size)
    if key not in _GROUPS:
        tp_g = dp_g = None
        for d in range(dp):
            g = dist.new_group(list(range(d, world, dp)))  # wrong: strided TP groups
            if rank % dp == d:
                tp_g = g
        for t in range(tp_size):
            g = dist.new_group(list(range(t * dp, t * dp + dp)))
            if rank // dp == t:
                dp_g = g
        _GROUPS[key] = (tp_g, dp_g)
    tp_g, dp_g = _GROUPS[key]
    s, m = x.clone(), x.clone()
    if x.numel():
        if tp_size > 1:
            dist.all_reduce(s, group=tp_g)
        if dp > 1:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=dp_g)
    return s, m
