# Correct but slow: Megatron's recipe applied to the whole sequence. All-gather every rank's ids, look up the ones
# in this rank's shard (zeros elsewhere), all-reduce the partial [S, d] embeddings and keep this rank's rows: the
# all-reduce moves every row of the sequence, world_size times what the ranks need.
import torch
import torch.distributed as dist


def vocab_parallel_embedding(ids, table_shard, vocab_bounds, seq_lens):
    rank, world = dist.get_rank(), dist.get_world_size()
    dev, d = table_shard.device, table_shard.shape[1]
    lo, hi = vocab_bounds[rank], vocab_bounds[rank + 1]
    m = max(seq_lens)
    if m == 0:
        return table_shard.new_empty((0, d))
    padded = torch.zeros(m, dtype=torch.int64, device=dev)
    padded[:ids.numel()] = ids
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    seq = torch.cat([g[:n] for g, n in zip(gathered, seq_lens)])
    mine = (seq >= lo) & (seq < hi)
    part = torch.zeros((seq.numel(), d), dtype=table_shard.dtype, device=dev)
    if hi > lo:
        part[mine] = table_shard[seq[mine] - lo]
    dist.all_reduce(part)
    start = sum(seq_lens[:rank])
    return part[start:start + seq_lens[rank]].clone()
