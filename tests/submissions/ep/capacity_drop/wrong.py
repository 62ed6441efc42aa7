# Plausible bug: every rank applies the capacity to its own tokens only (each keeps up to `capacity` tokens
# per expert), forgetting the tokens that lower ranks already routed to the same expert.
from typing import Callable

import torch
import torch.distributed as dist


def _exchange(sends: list, recvs: list) -> None:
    """One round: every (tensor, peer) send and receive posted at once; empty ones skipped (both sides know the
    sizes, so they skip the same messages)."""
    ops = [dist.P2POp(dist.isend, t, p) for t, p in sends if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, p) for t, p in recvs if t.numel()]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def moe_forward(tokens: torch.Tensor, expert_ids: torch.Tensor,
                expert_fn: Callable[[int, torch.Tensor], torch.Tensor], experts_per_rank: int,
                capacity: int) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    epr = experts_per_rank
    n_exp = world * epr
    n_tok, d = tokens.shape
    dev = tokens.device
    ids = expert_ids.reshape(-1).to(torch.int64)

    # 1. every rank's tokens per expert (tiny): one round to and from every peer
    counts = torch.bincount(ids, minlength=n_exp)
    table = torch.empty((world, n_exp), dtype=torch.int64, device=dev)
    table[rank].copy_(counts)
    _exchange([(counts, p) for p in range(world) if p != rank], [(table[p], p) for p in range(world) if p != rank])

    # 2. the capacity rule, known everywhere from the table: expert e keeps min(count, C - tokens of lower ranks)
    before = torch.zeros_like(table)  # BUG: the capacity is applied per source rank, ignoring lower ranks' tokens
    kept = torch.minimum(table, (capacity - before).clamp_min(0))  # [source, expert]: tokens each source keeps

    # 3. drop at the sender: sort by expert (groups by owner rank, then local expert, token order within) and keep
    #    the first kept[rank, e] of each expert's group
    order = torch.argsort(ids, stable=True)
    sorted_ids = ids[order]
    first = torch.cumsum(counts, 0) - counts
    keep = torch.arange(n_tok, device=dev) - first[sorted_ids] < kept[rank][sorted_ids]
    send_idx = order[keep]
    send_buf = tokens.index_select(0, send_idx)
    send_splits = kept[rank].view(world, epr).sum(1).tolist()
    rk = kept[:, rank * epr:(rank + 1) * epr]                    # [source, local expert]: rows I receive
    recv_splits = rk.sum(1).tolist()

    # 4. dispatch: straight into one receive buffer ordered (source rank, local expert)
    recv_buf = tokens.new_empty((sum(recv_splits), d))
    sends = list(zip(torch.split(send_buf, send_splits), range(world)))
    recvs = list(zip(torch.split(recv_buf, recv_splits), range(world)))
    recvs[rank][0].copy_(sends[rank][0])
    del sends[rank], recvs[rank]
    _exchange(sends, recvs)

    # 5. experts: regroup the received rows by local expert, one expert_fn call per expert that has rows
    local_of_row = torch.arange(epr, device=dev).repeat(world).repeat_interleave(rk.reshape(-1),
                                                                                 output_size=recv_buf.shape[0])
    group = torch.argsort(local_of_row, stable=True)
    processed = torch.empty_like(recv_buf)
    start = 0
    for local, cnt in enumerate(rk.sum(0).tolist()):
        if cnt:
            rows = group[start:start + cnt]
            processed[rows] = expert_fn(local, recv_buf.index_select(0, rows))
            start += cnt

    # 6. combine: the reverse exchange, then scatter into place; dropped tokens stay 0
    back = tokens.new_empty((send_buf.shape[0], d))
    sends = list(zip(torch.split(processed, recv_splits), range(world)))
    recvs = list(zip(torch.split(back, send_splits), range(world)))
    recvs[rank][0].copy_(sends[rank][0])
    del sends[rank], recvs[rank]
    _exchange(sends, recvs)
    out = torch.zeros_like(tokens)
    out[send_idx] = back
    return out
