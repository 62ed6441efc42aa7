# Plausible bug: the online softmax subtracts the running maximum but never rescales what was accumulated before
# the maximum grew (the `exp(m_old - m_new)` factor is missing). Exact with one block, and whenever the first
# block happens to hold every row's maximum; wrong as soon as a later block raises it.
import math

import torch
import torch.distributed as dist


def ring_attention(q, k, v, seq_lens, causal):
    rank, world = dist.get_rank(), dist.get_world_size()
    n, heads, dim = q.shape
    group = heads // k.shape[1]
    kv = torch.cat([k, v], dim=1).contiguous()
    kvh = k.shape[1]
    qf = q.float() / math.sqrt(dim)
    m_run = torch.full((n, heads), float("-inf"))
    l_run = torch.zeros((n, heads))
    acc = torch.zeros((n, heads, dim))

    def absorb(block, diagonal):
        nonlocal m_run, l_run, acc
        kb = block[:, :kvh].float().repeat_interleave(group, dim=1)
        vb = block[:, kvh:].float().repeat_interleave(group, dim=1)
        s = torch.einsum("nhd,mhd->nhm", qf, kb)
        if diagonal:
            s = s.masked_fill(torch.ones(n, kb.shape[0], dtype=torch.bool).triu(1)[:, None, :], float("-inf"))
        m_run = torch.maximum(m_run, s.amax(dim=-1))
        p = torch.exp(s - m_run.unsqueeze(-1))
        l_run = l_run + p.sum(-1)  # BUG: the old l_run and acc are not scaled by exp(m_old - m_new)
        acc = acc + torch.einsum("nhm,mhd->nhd", p, vb)

    if n:
        absorb(kv, causal)
    cur = kv
    for step in range(1, world):  # a plain ring: forward what arrived, receive from the left
        src = (rank - step) % world
        nxt = torch.empty((seq_lens[src], 2 * kvh, dim), dtype=kv.dtype)
        ops = []
        if cur.numel():
            ops.append(dist.P2POp(dist.isend, cur, (rank + 1) % world))
        if nxt.numel():
            ops.append(dist.P2POp(dist.irecv, nxt, (rank - 1) % world))
        for req in dist.batch_isend_irecv(ops) if ops else []:
            req.wait()
        cur = nxt
        if n and nxt.shape[0] and (not causal or src < rank):
            absorb(nxt, False)
    lse = m_run + torch.log(l_run)
    return acc / l_run.unsqueeze(-1), lse
