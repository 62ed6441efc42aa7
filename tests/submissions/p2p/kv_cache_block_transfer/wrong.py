# Plausible bug: the decode rank builds a FRESH pool holding only the blocks it received ("the transferred
# sequences"), instead of writing them into its existing pool: every slot that is no target, and every cached
# slot it skipped, comes back as zeros.
import torch
import torch.distributed as dist


def transfer_kv_blocks(pool, table_offsets, table_blocks, seq_rank, cached_blocks):
    rank, world = dist.get_rank(), dist.get_world_size()
    n_seq = seq_rank.numel()
    lengths = table_offsets[1:] - table_offsets[:-1]
    seq_of = torch.repeat_interleave(torch.arange(n_seq), lengths)
    pos = torch.arange(table_blocks.numel()) - table_offsets[seq_of]
    seqs_of = torch.bincount(seq_rank, minlength=world).tolist()
    if rank == 0:
        cached = torch.zeros(n_seq, dtype=torch.int64)
        ask = [r for r in range(1, world) if seqs_of[r]]
        hits = {r: torch.empty(seqs_of[r], dtype=torch.int64) for r in ask}
        for req in dist.batch_isend_irecv([dist.P2POp(dist.irecv, hits[r], r) for r in ask]) if ask else []:
            req.wait()
        for r in ask:
            cached[seq_rank == r] = hits[r]
        dest = seq_rank[seq_of]
        idx = (pos >= cached[seq_of]).nonzero()[:, 0]
        idx = idx[torch.argsort(dest[idx], stable=True)]
        counts = torch.bincount(dest[idx], minlength=world).tolist()
        payload = pool.index_select(0, table_blocks[idx])
        ops = [dist.P2POp(dist.isend, p, r) for r, p in enumerate(torch.split(payload, counts)) if r and counts[r]]
        for req in dist.batch_isend_irecv(ops) if ops else []:
            req.wait()
        return pool
    if not seqs_of[rank]:
        return pool
    mine = seq_rank == rank
    ops = [dist.P2POp(dist.isend, cached_blocks[mine].contiguous(), 0)]
    slots = table_blocks[pos >= cached_blocks[seq_of]]
    out = torch.zeros_like(pool)
    if slots.numel():
        buf = torch.empty((slots.numel(), *pool.shape[1:]), dtype=pool.dtype)
        ops.append(dist.P2POp(dist.irecv, buf, 0))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    if slots.numel():
        out[slots] = buf
    return out
