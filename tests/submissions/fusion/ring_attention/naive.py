# Correct but slow: a plain ring that forwards every block to every rank (causal or not), one hop at a time and
# with K and V as separate messages; attention over the gathered sequence at the end.
import math

import torch
import torch.distributed as dist


def ring_attention(q, k, v, seq_lens, causal):
    rank, world = dist.get_rank(), dist.get_world_size()
    n, heads, dim = q.shape
    group = heads // k.shape[1]
    ks, vs = [None] * world, [None] * world
    ks[rank], vs[rank] = k.contiguous(), v.contiguous()
    for step in range(1, world):
        send_src, src = (rank - step + 1) % world, (rank - step) % world
        kin = torch.empty((seq_lens[src],) + tuple(k.shape[1:]), dtype=k.dtype)
        vin = torch.empty_like(kin)
        ops = []
        if ks[send_src].numel():
            ops += [dist.P2POp(dist.isend, ks[send_src], (rank + 1) % world),
                    dist.P2POp(dist.isend, vs[send_src], (rank + 1) % world)]
        if kin.numel():
            ops += [dist.P2POp(dist.irecv, kin, (rank - 1) % world), dist.P2POp(dist.irecv, vin, (rank - 1) % world)]
        for req in dist.batch_isend_irecv(ops) if ops else []:
            req.wait()
        ks[src], vs[src] = kin, vin
    kk = torch.cat(ks).double().repeat_interleave(group, dim=1)
    vv = torch.cat(vs).double().repeat_interleave(group, dim=1)
    s = torch.einsum("nhd,mhd->hnm", q.double(), kk) / math.sqrt(dim)
    if causal:
        start = sum(seq_lens[:rank])
        qpos = torch.arange(start, start + n)
        s = s.masked_fill(torch.arange(kk.shape[0])[None, :] > qpos[:, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1).T
    out = torch.einsum("hnm,mhd->nhd", torch.softmax(s, dim=-1), vv)
    return out, lse
