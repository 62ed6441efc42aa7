import torch
import torch.distributed as dist


def _all_gather_rows(mine: torch.Tensor, table: torch.Tensor, rank: int, world: int) -> None:
    """table[p] = rank p's `mine`, for every p: one round of messages to and from every peer at once (the vectors
    are tiny, so this costs one message latency; a library all-gather would take world - 1 steps)."""
    table[rank].copy_(mine)
    ops = []
    for p in range(world):
        if p != rank:
            ops.append(dist.P2POp(dist.isend, mine, p))
            ops.append(dist.P2POp(dist.irecv, table[p], p))
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def dispatch_layout(topk_idx: torch.Tensor, experts_per_rank: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    epr = experts_per_rank
    n_exp = world * epr
    t = topk_idx.shape[0]
    dev = topk_idx.device
    valid = topk_idx >= 0
    safe = torch.where(valid, topk_idx, n_exp)  # -1 entries go to a spare column, dropped below
    rows = torch.zeros((t, n_exp + 1), dtype=torch.int64, device=dev).scatter_(1, safe, 1)[:, :n_exp]  # [T, E]
    hits = rows.view(t, world, epr).amax(2)                                                            # [T, W]

    # every rank's counts per destination rank and per expert, as one [world, world + E] table
    mine = torch.cat([hits.sum(0), rows.sum(0)])
    table = torch.empty((world, world + n_exp), dtype=torch.int64, device=dev)
    _all_gather_rows(mine, table, rank, world)
    before = table[:rank].sum(0)  # what the lower ranks put ahead of this rank's tokens
    rank_base, exp_base = before[:world], before[world:]

    rank_offset = torch.where(hits > 0, rank_base + hits.cumsum(0) - 1, -1)
    pos = exp_base + rows.cumsum(0) - 1  # [T, E]: each row's place in every expert's batch
    expert_offset = torch.where(valid, pos.gather(1, safe.clamp_max(n_exp - 1)), -1)
    return mine[:world].clone(), table[:, world:].sum(0), rank_offset, expert_offset
