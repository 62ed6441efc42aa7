# Plausible bug: ownership from Megatron's padded-vocabulary rule, ceil(V / world) rows per rank, instead of the
# vocab_bounds given. Right whenever V divides by the world size; wrong rows (or a rank that does not answer)
# otherwise.
import torch
import torch.distributed as dist


def _exchange(sends, recvs):
    ops = [dist.P2POp(dist.isend, t, p) for t, p in sends if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, p) for t, p in recvs if t.numel()]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def vocab_parallel_embedding(ids, table_shard, vocab_bounds, seq_lens):
    rank, world = dist.get_rank(), dist.get_world_size()
    dev, d = table_shard.device, table_shard.shape[1]
    per = -(-vocab_bounds[-1] // world)
    lo = rank * per
    theirs = {q: torch.empty(seq_lens[q], dtype=torch.int64, device=dev) for q in range(world) if q != rank}
    _exchange([(ids.contiguous(), p) for p in theirs], list((t, q) for q, t in theirs.items()))
    owner = ids // per
    out = table_shard.new_zeros((ids.numel(), d))
    here = owner == rank
    idx = (ids[here] - lo).clamp(0, max(table_shard.shape[0] - 1, 0))
    if table_shard.shape[0]:
        out[here] = table_shard[idx]
    replies, recvs, where = [], [], {}
    for q, req in theirs.items():
        sel = req[req // per == rank] - lo
        rows = table_shard[sel.clamp(0, max(table_shard.shape[0] - 1, 0))] if table_shard.shape[0] else \
            table_shard.new_zeros((sel.numel(), d))
        replies.append((rows.contiguous(), q))
        pos = (owner == q).nonzero().view(-1)
        where[q] = pos
        recvs.append((table_shard.new_empty((pos.numel(), d)), q))
    _exchange(replies, recvs)
    for (buf, q) in recvs:
        out[where[q]] = buf
    return out
