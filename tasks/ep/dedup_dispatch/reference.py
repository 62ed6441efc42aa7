import torch
import torch.distributed as dist


def _exchange(sends: list, recvs: list) -> None:
    """One round: every (tensor, peer) send and receive posted at once; empty ones skipped (both sides know the
    sizes, so they skip the same messages)."""
    ops = [dist.P2POp(dist.isend, t, p) for t, p in sends if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, p) for t, p in recvs if t.numel()]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


# On CPUs (the modelled fabric), the mean row message above which a shift schedule beats posting every message
# at once: about 5 us of bytes at 370 GB/s against the (W - 2) extra latencies of the steps.
STEP_BYTES = 2 << 20


def _unpack(cols: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Columns of packed byte rows as `dtype`: copied into fresh storage first, since a view needs aligned
    offsets and strides (`.contiguous()` keeps the strides of a one-row slice)."""
    out = torch.empty(cols.shape, dtype=torch.uint8, device=cols.device)
    return out.copy_(cols).view(dtype)


def dedup_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, experts_per_rank: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    epr = experts_per_rank
    n_tok, d = x.shape
    k = topk_idx.shape[1]
    dev = x.device
    ids = topk_idx.to(torch.int64)

    # Per destination rank p and local expert l: the top-k slot of the token that names expert p * epr + l, or -1
    # (experts are distinct within a row, so there is at most one). [T, world, epr] int8 (k <= 127).
    slot = torch.full((n_tok, world * epr + 1), -1, dtype=torch.int8, device=dev)
    cols = torch.where(ids >= 0, ids, world * epr)
    slot.scatter_(1, cols, torch.arange(k, dtype=torch.int8, device=dev).expand(n_tok, k).contiguous())
    slot = slot[:, :world * epr].view(n_tok, world, epr)
    hit = (slot >= 0).any(2)  # [T, world]: the token crosses to rank p once, however many experts it has there

    # One packed row per (token, destination rank): the token's bytes, its index (int32) and its slots for the
    # destination's experts (int8). Data and metadata then travel as one message per peer.
    xb = x.contiguous().view(torch.uint8)  # [T, d * element size]
    row_bytes = d * x.element_size() + 4 + epr
    picks = [hit[:, p].nonzero().flatten() for p in range(world)]
    packed = []
    for p in range(world):
        idx = picks[p]
        packed.append(torch.cat([xb.index_select(0, idx),
                                 idx.to(torch.int32).view(-1, 1).view(torch.uint8),
                                 slot[idx, p].view(torch.uint8)], 1))

    # Counts first (one tiny round, every peer at once): each rank sends its whole row of counts, so that every
    # rank knows the whole [source, destination] matrix and picks the same schedule for the rows.
    send_n = torch.tensor([int(t.shape[0]) for t in packed], dtype=torch.int64, device=dev)
    table = torch.empty((world, world), dtype=torch.int64, device=dev)
    table[rank].copy_(send_n)
    order = [(rank + o) % world for o in range(1, world)]
    _exchange([(send_n, p) for p in order], [(table[p], p) for p in order])
    counts = table[:, rank].tolist()
    incoming = [packed[rank] if p == rank else torch.empty((counts[p], row_bytes), dtype=torch.uint8, device=dev)
                for p in range(world)]
    off_diag = (table.sum() - table.diagonal().sum()).item()
    mean_msg = off_diag * row_bytes / max(1, world * (world - 1))
    if x.device.type == "cpu" and world >= 4 and mean_msg >= STEP_BYTES:
        # Large messages of uneven sizes, all posted at once, leave gaps on the ports (a message waits for its
        # receiver's port while the sender's idles); a shift schedule (step t: send to rank + t, receive from
        # rank - t, the next step posted once this step's rows are in) keeps each port busy with one message.
        pending = []
        for p in order:
            q = (2 * rank - p) % world  # the rank that sends to this one in the same step
            ops = [dist.P2POp(dist.irecv, incoming[q], q)] if counts[q] else []
            ops += [dist.P2POp(dist.isend, packed[p], p)] if packed[p].numel() else []
            reqs = dist.batch_isend_irecv(ops) if ops else []
            if counts[q]:
                reqs[0].wait()
            pending += reqs[1:] if counts[q] else reqs
        for req in pending:
            req.wait()
    else:
        _exchange([(packed[p], p) for p in order], [(incoming[p], p) for p in order])

    # Expand on the receiving side: rows arrive ordered (source, token); each local expert takes the rows whose
    # slot for it is set, in that order.
    rows = torch.cat(incoming)
    xw = d * x.element_size()
    got_x = _unpack(rows[:, :xw], x.dtype)
    got_i = _unpack(rows[:, xw:xw + 4], torch.int32).view(-1)
    got_slot = _unpack(rows[:, xw + 4:], torch.int8).to(torch.int64)
    got_s = torch.repeat_interleave(torch.arange(world, device=dev), torch.tensor(counts, device=dev),
                                    output_size=rows.shape[0])
    xs, srcs, per_expert = [], [], []
    for local in range(epr):
        take = (got_slot[:, local] >= 0).nonzero().flatten()
        xs.append(got_x.index_select(0, take))
        srcs.append(torch.stack([got_s[take], got_i[take].to(torch.int64), got_slot[take, local]], 1))
        per_expert.append(int(take.numel()))
    return (torch.cat(xs), torch.cat(srcs), torch.tensor(per_expert, dtype=torch.int64, device=dev))
