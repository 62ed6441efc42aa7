import math

import torch
import torch.distributed as dist

# Asking the decode ranks which blocks they have cached costs one more message latency (~2 us, the time to move
# ~740 KB at 370 GB/s); all the blocks leave through rank 0's one outgoing port. So when all the blocks together
# are below about this many bytes, sending them all without asking is faster.
EAGER_BYTES = 1 << 20


def _entries(table_offsets: torch.Tensor, n_entries: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For every entry of a CSR block table: its sequence and its block index within the sequence."""
    seqs = torch.arange(table_offsets.numel() - 1, device=table_offsets.device)
    seq_of = torch.repeat_interleave(seqs, table_offsets[1:] - table_offsets[:-1], output_size=n_entries)
    return seq_of, torch.arange(n_entries, device=table_offsets.device) - table_offsets[seq_of]


def transfer_kv_blocks(pool: torch.Tensor, table_offsets: torch.Tensor, table_blocks: torch.Tensor,
                       seq_rank: torch.Tensor, cached_blocks: torch.Tensor | None) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = pool.device
    table_offsets, table_blocks, seq_rank = table_offsets.to(dev), table_blocks.to(dev), seq_rank.to(dev)
    n_seq = seq_rank.numel()
    block_bytes = math.prod(pool.shape[1:]) * pool.element_size()
    lengths = table_offsets[1:] - table_offsets[:-1]
    # Both sides know, from public data, every decode rank's number of sequences and of blocks (rank 0 from its
    # own table, a decode rank from its target table): so both pick the same protocol per decode rank without a
    # message, and every message size is known to its receiver.
    seqs_of = torch.bincount(seq_rank, minlength=world).tolist()
    active = sum(1 for r in range(1, world) if seqs_of[r])
    seq_of, pos = _entries(table_offsets, table_blocks.numel())

    def asks(n_blocks: int) -> bool:
        """Whether the decode rank with n_blocks blocks is asked for its cache hits. A decode rank does not know
        the other ranks' block counts, only how many of them have sequences: it estimates rank 0's whole traffic
        from its own, and rank 0 applies the same formula, so both sides always agree."""
        return n_blocks * block_bytes * active > EAGER_BYTES

    if rank == 0:
        blocks_of = torch.bincount(seq_rank, weights=lengths.to(torch.float64), minlength=world).long().tolist()
        ask = [r for r in range(1, world) if asks(blocks_of[r])]
        # 1. the cache hits of the decode ranks that are asked: one tiny message each, all in flight at once
        cached = torch.zeros(n_seq, dtype=torch.int64, device=dev)
        hits = {r: torch.empty(seqs_of[r], dtype=torch.int64, device=dev) for r in ask}
        for req in dist.batch_isend_irecv([dist.P2POp(dist.irecv, hits[r], r) for r in ask]) if ask else []:
            req.wait()
        for r in ask:
            cached[seq_rank == r] = hits[r]
        # 2. the blocks that must travel, grouped by decode rank and, within one, in (sequence, block) order: the
        # order of the decode rank's own table. One gather, then one message per decode rank.
        dest = seq_rank[seq_of]
        idx = (pos >= cached[seq_of]).nonzero()[:, 0]
        idx = idx[torch.argsort(dest[idx], stable=True)]
        counts = torch.bincount(dest[idx], minlength=world).tolist()
        payload = pool.index_select(0, table_blocks[idx])
        ops = [dist.P2POp(dist.isend, part, r) for r, part in enumerate(torch.split(payload, counts))
               if r and counts[r]]
        for req in dist.batch_isend_irecv(ops) if ops else []:
            req.wait()
        return pool

    if not seqs_of[rank]:
        return pool  # no sequence for this rank: no message either way
    mine = seq_rank == rank
    ops = []
    if asks(table_blocks.numel()):  # tell rank 0 the cache hits of my sequences; only the other blocks come
        ops.append(dist.P2POp(dist.isend, cached_blocks.to(dev)[mine].contiguous(), 0))
        slots = table_blocks[pos >= cached_blocks.to(dev)[seq_of]]
    else:  # small: everything comes (cached slots are rewritten with the bytes they already hold)
        slots = table_blocks
    buf = None
    if slots.numel():
        buf = torch.empty((slots.numel(), *pool.shape[1:]), dtype=pool.dtype, device=dev)
        ops.append(dist.P2POp(dist.irecv, buf, 0))
    # the send and the receive in one batch: under NCCL the receive is not queued behind the send
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    if buf is not None:
        pool.index_copy_(0, slots, buf)  # scatter on arrival, in place: every other slot keeps its bytes
    return pool
