from typing import Callable

import torch
import torch.distributed as dist


def moe_forward(tokens: torch.Tensor, expert_ids: torch.Tensor,
                expert_fn: Callable[[int, torch.Tensor], torch.Tensor], experts_per_rank: int) -> torch.Tensor:
    world = dist.get_world_size()
    epr = experts_per_rank
    n_tok, d = tokens.shape
    ids = expert_ids.reshape(-1).to(torch.int64)

    # 1. permute: sorting by global expert id groups tokens by owner rank, then by local expert
    order = torch.argsort(ids, stable=True)
    send_buf = tokens.index_select(0, order).contiguous()
    counts = torch.bincount(ids, minlength=world * epr)                 # [world * epr]

    # 2. exchange per-expert counts: recv_counts[s * epr + l] = tokens rank s sends to my local expert l
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)
    send_splits = counts.view(world, epr).sum(1).tolist()
    rc = recv_counts.view(world, epr)
    recv_splits = rc.sum(1).tolist()

    # 3. dispatch
    recv_buf = tokens.new_empty((sum(recv_splits), d))
    dist.all_to_all_single(recv_buf, send_buf, recv_splits, send_splits)

    # 4. experts: received rows are ordered (source rank, local expert); regroup by local expert
    local_of_row = torch.arange(epr, device=tokens.device).repeat(world).repeat_interleave(
        rc.reshape(-1), output_size=recv_buf.shape[0])
    group = torch.argsort(local_of_row, stable=True)
    grouped = recv_buf.index_select(0, group)
    processed = torch.empty_like(recv_buf)
    per_expert = rc.sum(0).tolist()
    start = 0
    for local, cnt in enumerate(per_expert):
        if cnt:
            processed[group[start:start + cnt]] = expert_fn(local, grouped[start:start + cnt])
            start += cnt

    # 5. combine: reverse all-to-all, then undo the permutation
    back = tokens.new_empty((n_tok, d))
    dist.all_to_all_single(back, processed, send_splits, recv_splits)
    out = torch.empty_like(tokens)
    out[order] = back
    return out
