# Correct but slow at these sizes: the counts first, then variable-sized payloads. Two rounds of message latency
# where one would do, and the payload waits for the counts.
import torch
import torch.distributed as dist


def _round(sends, recvs):
    ops = [dist.P2POp(dist.isend, t, p) for t, p in sends if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, p) for t, p in recvs if t.numel()]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def low_latency_dispatch(x, topk_idx, max_tokens, experts_per_rank):
    rank, world = dist.get_rank(), dist.get_world_size()
    epr, m = experts_per_rank, max_tokens
    d = x.shape[1]
    dev = x.device
    peers = [p for p in range(world) if p != rank]
    # per expert, the token indices routed to it (grouped by owner rank, then local expert)
    idx = [(topk_idx == e).any(1).nonzero()[:, 0] for e in range(world * epr)]
    counts = torch.tensor([i.numel() for i in idx], dtype=torch.int64, device=dev).view(world, epr)
    recv_counts = torch.empty_like(counts)
    recv_counts[rank] = counts[rank]
    _round([(counts[p], p) for p in peers], [(recv_counts[p], p) for p in peers])
    send_idx = [torch.cat(idx[p * epr:(p + 1) * epr]) for p in range(world)]
    n_in = recv_counts.sum(1).tolist()
    recv_rows = [x.new_empty((n_in[p], d)) for p in range(world)]
    recv_src = [torch.empty(n_in[p], dtype=torch.int64, device=dev) for p in range(world)]
    recv_rows[rank], recv_src[rank] = x[send_idx[rank]], send_idx[rank]
    _round([(x[send_idx[p]], p) for p in peers] + [(send_idx[p], p) for p in peers],
           [(recv_rows[p], p) for p in peers] + [(recv_src[p], p) for p in peers])
    recv_x = x.new_zeros((epr, world * m, d))
    recv_src_idx = torch.full((epr, world * m), -1, dtype=torch.int64, device=dev)
    for s in range(world):
        start = 0
        for l in range(epr):
            n = int(recv_counts[s, l])
            recv_x[l, s * m:s * m + n] = recv_rows[s][start:start + n]
            recv_src_idx[l, s * m:s * m + n] = recv_src[s][start:start + n]
            start += n
    return recv_x, recv_counts.t().contiguous(), recv_src_idx
