# WRONG: a textbook sample sort (regular samples, splitters, one all-to-all-v of the keys with their origins),
# so the result is sorted across the ranks, but without the final rebalance: each rank returns its whole bucket,
# whose size is only roughly N / W, and the splitters compare keys alone, so every copy of a duplicated key lands
# on one rank.
import torch
import torch.distributed as dist

S = 16  # samples per rank


def _exchange(ops):
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def sample_sort(keys):
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = keys.device
    sk, si = torch.sort(keys, stable=True)
    n = sk.numel()
    samples = torch.full((world, S + 1), 0, dtype=torch.int64, device=dev)
    samples[rank, 0] = min(n, S)
    if n:
        pos = (torch.arange(min(n, S), device=dev) * n) // min(n, S)
        samples[rank, 1:1 + pos.numel()] = sk[pos]
    peers = [((rank + t) % world, (rank - t) % world) for t in range(1, world)]
    _exchange([op for dst, src in peers for op in (dist.P2POp(dist.isend, samples[rank], dst),
                                                   dist.P2POp(dist.irecv, samples[src], src))])
    pool = torch.cat([samples[s, 1:1 + int(samples[s, 0])] for s in range(world)]).sort().values
    if pool.numel():
        split = pool[(torch.arange(1, world, device=dev) * pool.numel()) // world]
    else:
        split = torch.zeros(world - 1, dtype=torch.int64, device=dev)
    edges = [0] + torch.searchsorted(sk, split).tolist() + [n]
    send = torch.tensor([edges[d + 1] - edges[d] for d in range(world)], dtype=torch.int64, device=dev)
    recv = torch.zeros(world, dtype=torch.int64, device=dev)
    recv[rank] = send[rank]
    _exchange([op for dst, src in peers for op in (dist.P2POp(dist.isend, send[dst:dst + 1], dst),
                                                   dist.P2POp(dist.irecv, recv[src:src + 1], src))])
    rc = recv.tolist()
    rows = torch.stack([sk, si, torch.full_like(sk, rank)], 1)
    got = [rows[edges[rank]:edges[rank + 1]] if s == rank else torch.empty((rc[s], 3), dtype=torch.int64, device=dev)
           for s in range(world)]
    ops = []
    for dst, src in peers:
        if edges[dst + 1] > edges[dst]:
            ops.append(dist.P2POp(dist.isend, rows[edges[dst]:edges[dst + 1]].contiguous(), dst))
        if rc[src]:
            ops.append(dist.P2POp(dist.irecv, got[src], src))
    _exchange(ops)
    allr = torch.cat(got)
    order = torch.sort(allr[:, 0], stable=True).indices
    allr = allr[order]
    return allr[:, 0], allr[:, 2], allr[:, 1]
