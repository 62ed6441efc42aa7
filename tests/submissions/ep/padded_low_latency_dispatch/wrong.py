# Plausible bug: the slots and counts are right, but recv_src_idx records each row's position in its slot
# (0, 1, 2, ...) instead of the token's index on its source rank.
import torch
import torch.distributed as dist


def low_latency_dispatch(x, topk_idx, max_tokens, experts_per_rank):
    rank, world = dist.get_rank(), dist.get_world_size()
    epr, m = experts_per_rank, max_tokens
    d = x.shape[1]
    # per local expert of every peer, a slab of M rows and its count
    send = x.new_zeros((world, epr, m, d))
    counts = torch.zeros((world, epr), dtype=torch.int64, device=x.device)
    for e in range(world * epr):
        idx = (topk_idx == e).any(1).nonzero()[:, 0]
        send[e // epr, e % epr, :idx.numel()] = x[idx]
        counts[e // epr, e % epr] = idx.numel()
    recv = torch.empty_like(send)
    recv_counts = torch.empty_like(counts)
    ops = []
    for p in range(world):
        if p == rank:
            recv[p].copy_(send[p])
            recv_counts[p].copy_(counts[p])
            continue
        ops += [dist.P2POp(dist.isend, send[p], p), dist.P2POp(dist.isend, counts[p], p),
                dist.P2POp(dist.irecv, recv[p], p), dist.P2POp(dist.irecv, recv_counts[p], p)]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    recv_x = recv.permute(1, 0, 2, 3).reshape(epr, world * m, d).contiguous()
    recv_count = recv_counts.t().contiguous()
    recv_src_idx = torch.arange(m, device=x.device).repeat(world).expand(epr, world * m).contiguous()  # BUG
    return recv_x, recv_count, recv_src_idx
