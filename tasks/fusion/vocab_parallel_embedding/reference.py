import torch
import torch.distributed as dist


def _exchange(sends: list, recvs: list) -> None:
    """One round: every (tensor, peer) send and receive posted at once; empty ones skipped (both sides know the
    sizes, so they skip the same messages)."""
    ops = [dist.P2POp(dist.isend, t, p) for t, p in sends if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, p) for t, p in recvs if t.numel()]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def vocab_parallel_embedding(ids: torch.Tensor, table_shard: torch.Tensor, vocab_bounds: list[int],
                             seq_lens: list[int]) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    dev, d = table_shard.device, table_shard.shape[1]
    lo, hi = vocab_bounds[rank], vocab_bounds[rank + 1]
    owners = [p for p in range(world) if p != rank and vocab_bounds[p + 1] > vocab_bounds[p]]
    wire = torch.int32 if vocab_bounds[-1] < 2 ** 31 else torch.int64  # ids on the wire: half the bytes

    # 1. requests: my ids to every peer that owns rows (sizes known from seq_lens); ids of every peer from it
    mine = ids.reshape(-1).to(wire).contiguous()
    theirs = {q: torch.empty(seq_lens[q], dtype=wire, device=dev) for q in range(world) if q != rank}
    _exchange([(mine, p) for p in owners], [(theirs[q], q) for q in theirs] if hi > lo else [])

    # 2. replies: each owner sends each requester the distinct rows it asked for, in ascending id order; the
    #    requester knows those counts from its own ids, so no count round is needed
    uniq, inverse = torch.unique(ids.reshape(-1), sorted=True, return_inverse=True)
    bounds = torch.tensor(vocab_bounds, dtype=torch.int64, device=dev)
    per_owner = torch.diff(torch.searchsorted(uniq, bounds)).tolist()
    rows = table_shard.new_empty((uniq.numel(), d))
    parts = list(torch.split(rows, per_owner))
    parts[rank].copy_(table_shard.index_select(0, torch.split(uniq, per_owner)[rank] - lo))
    replies = []
    if hi > lo:
        for q, req in theirs.items():
            r = req.to(torch.int64)
            wanted = torch.unique(r[(r >= lo) & (r < hi)], sorted=True)
            replies.append((table_shard.index_select(0, wanted - lo), q))
    _exchange(replies, [(parts[p], p) for p in owners])
    return rows.index_select(0, inverse)
