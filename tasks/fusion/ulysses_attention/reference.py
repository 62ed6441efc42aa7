import torch
import torch.distributed as dist
import torch.nn.functional as F


def _head_split(heads: int, world: int) -> list[int]:
    """Heads per rank: contiguous groups, the first heads % world ranks one more (some ranks none if heads < world)."""
    base, extra = divmod(heads, world)
    return [base + (j < extra) for j in range(world)]


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    n, heads, dim = q.shape
    split = _head_split(heads, world)
    mine = split[rank]

    # 1. one all-to-all for q, k and v together: [H, 3, n, D], dim 0 cut into each rank's heads. Rank r receives
    #    its heads of every rank's tokens, [world * mine, 3, n, D], source rank major (= sequence order).
    send = torch.stack([q, k, v]).permute(2, 0, 1, 3).contiguous()
    recv = torch.empty((world * mine, 3, n, dim), dtype=q.dtype, device=q.device)
    dist.all_to_all_single(recv, send, output_split_sizes=[mine] * world, input_split_sizes=split)

    # 2. full-sequence attention for this rank's heads: [mine, S, D]
    out_heads = torch.empty((world, mine, n, dim), dtype=q.dtype, device=q.device)
    if mine:
        full = recv.view(world, mine, 3, n, dim).permute(2, 1, 0, 3, 4).reshape(3, mine, world * n, dim)
        o = F.scaled_dot_product_attention(full[0], full[1], full[2], is_causal=causal)
        out_heads.copy_(o.view(mine, world, n, dim).transpose(0, 1))

    # 3. back: rank j gets the rows of its tokens for every head, [H, n, D] in head order
    back = torch.empty((heads, n, dim), dtype=q.dtype, device=q.device)
    dist.all_to_all_single(back, out_heads.view(world * mine, n, dim), output_split_sizes=split,
                           input_split_sizes=[mine] * world)
    return back.permute(1, 0, 2)
