# Plausible bug: after the all-to-all the full sequence is assembled token-major (position i * world + s) instead
# of rank-major (s * n + i), and taken apart the same way on the way back. Attention without a mask does not
# care about the order of the keys, so the non-causal cases pass; the causal mask then hides the wrong keys.
import torch
import torch.distributed as dist
import torch.nn.functional as F


def ulysses_attention(q, k, v, causal):
    rank, world = dist.get_rank(), dist.get_world_size()
    n, heads, dim = q.shape
    base, extra = divmod(heads, world)
    split = [base + (j < extra) for j in range(world)]
    mine = split[rank]
    send = torch.stack([q, k, v]).permute(2, 0, 1, 3).contiguous()
    recv = torch.empty((world * mine, 3, n, dim), dtype=q.dtype)
    dist.all_to_all_single(recv, send, output_split_sizes=[mine] * world, input_split_sizes=split)
    out_heads = torch.empty((world, mine, n, dim), dtype=q.dtype)
    if mine:
        full = recv.view(world, mine, 3, n, dim).permute(2, 1, 3, 0, 4).reshape(3, mine, n * world, dim)
        o = F.scaled_dot_product_attention(full[0], full[1], full[2], is_causal=causal)
        out_heads.copy_(o.view(mine, n, world, dim).permute(2, 0, 1, 3))
    back = torch.empty((heads, n, dim), dtype=q.dtype)
    dist.all_to_all_single(back, out_heads.view(world * mine, n, dim), output_split_sizes=split,
                           input_split_sizes=[mine] * world)
    return back.permute(1, 0, 2)
