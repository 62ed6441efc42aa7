# Correct but slow: ignores the cache hits and sends every block of every sequence as its own blocking message,
# one after the other.
import torch
import torch.distributed as dist


def transfer_kv_blocks(pool, table_offsets, table_blocks, seq_rank, cached_blocks):
    rank = dist.get_rank()
    offs = table_offsets.tolist()
    for i, r in enumerate(seq_rank.tolist()):
        if rank == 0:
            for b in table_blocks[offs[i]:offs[i + 1]].tolist():
                dist.send(pool[b].contiguous(), r)
        elif rank == r:
            for s in table_blocks[offs[i]:offs[i + 1]].tolist():
                buf = torch.empty_like(pool[s])
                dist.recv(buf, 0)
                pool[s] = buf
    return pool
