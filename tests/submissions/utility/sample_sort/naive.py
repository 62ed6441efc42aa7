# Correct but slow: every rank sends its count to every rank, then all its keys to every rank (an all-gather
# built from point-to-point messages), sorts all N keys itself and keeps its share. Each rank receives every key.
import torch
import torch.distributed as dist


def _exchange(ops):
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def sample_sort(keys):
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = keys.device
    counts = torch.zeros(world, dtype=torch.int64, device=dev)
    counts[rank] = keys.numel()
    peers = [((rank + t) % world, (rank - t) % world) for t in range(1, world)]
    _exchange([op for dst, src in peers for op in (dist.P2POp(dist.isend, counts[rank:rank + 1], dst),
                                                   dist.P2POp(dist.irecv, counts[src:src + 1], src))])
    n = counts.tolist()
    parts = [keys.contiguous() if s == rank else torch.empty(n[s], dtype=torch.int64, device=dev)
             for s in range(world)]
    ops = []
    for dst, src in peers:
        if n[rank]:
            ops.append(dist.P2POp(dist.isend, parts[rank], dst))
        if n[src]:
            ops.append(dist.P2POp(dist.irecv, parts[src], src))
    _exchange(ops)
    allk = torch.cat(parts)
    src = torch.cat([torch.full((n[s],), s, dtype=torch.int64, device=dev) for s in range(world)])
    idx = torch.cat([torch.arange(n[s], device=dev) for s in range(world)])
    order = torch.sort(allk, stable=True).indices
    total = allk.numel()
    mine = order[rank * total // world:(rank + 1) * total // world]
    return allk[mine], src[mine], idx[mine]
