# Plausible bug: the kv heads are expanded to the query heads with `repeat` (tiling: kv 0, 1, 0, 1, ...) instead
# of `repeat_interleave` (kv 0, 0, 1, 1, ...). Exact whenever a rank holds one kv head (MQA, kv heads shared by
# several ranks); wrong as soon as a rank holds two, where half its query heads read the other head's keys.
import torch
import torch.distributed as dist
import torch.nn.functional as F


def tp_attention(x, wq, wk, wv, wo, num_heads, num_kv_heads):
    rank, world = dist.get_rank(), dist.get_world_size()
    n, d = x.shape
    q_loc = num_heads // world
    hd = wq.shape[1] // q_loc
    m = wk.shape[1] // hd
    s = world * n
    full = torch.empty((world * n, d), dtype=x.dtype)
    dist.all_gather_into_tensor(full, x.contiguous())
    xs = full.float()
    q = (xs @ wq.float()).view(s, q_loc, hd).transpose(0, 1)
    k = (xs @ wk.float()).view(s, m, hd).transpose(0, 1)
    v = (xs @ wv.float()).view(s, m, hd).transpose(0, 1)
    rep = -(-q_loc // m)
    k, v = k.repeat(rep, 1, 1)[:q_loc], v.repeat(rep, 1, 1)[:q_loc]  # BUG: tiles the kv heads (0, 1, 0, 1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    part = (o.transpose(0, 1).reshape(s, q_loc * hd) @ wo.float()).to(x.dtype)
    mine = torch.empty((n, d), dtype=x.dtype)
    dist.reduce_scatter_tensor(mine, part.contiguous())
    return mine
