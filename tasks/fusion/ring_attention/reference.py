import math

import torch
import torch.distributed as dist


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int],
                   causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    n, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32  # accumulate in float32 at least
    # K and V travel together as one message [len, 2 * kv_heads, dim]: one latency per block instead of two
    kv = torch.cat([k, v], dim=1).contiguous()

    def wanted(src: int, dst: int, t: int) -> bool:
        """Whether block `src` goes to rank `dst` (at step t): dst has queries, src has keys, and (causal) src's
        keys all come before dst's queries, i.e. no wrap around the ring."""
        return seq_lens[src] > 0 and seq_lens[dst] > 0 and (not causal or src + t == dst)

    def post(t: int):
        """Step t: this rank's block goes to rank + t, block rank - t comes in. Every step is one batch on every
        rank (the same steps in the same order everywhere), so NCCL cannot deadlock on it."""
        dst, src = (rank + t) % world, (rank - t) % world
        ops, buf = [], None
        if wanted(rank, dst, t):
            ops.append(dist.P2POp(dist.isend, kv, dst))
        if wanted(src, rank, t):
            buf = torch.empty((seq_lens[src], 2 * kv_heads, dim), dtype=kv.dtype, device=kv.device)
            ops.append(dist.P2POp(dist.irecv, buf, src))
        return (dist.batch_isend_irecv(ops) if ops else []), buf

    # one step ahead: block t - 1 is computed while step t travels. Steps are not posted further ahead: a step is a
    # permutation (every rank sends to one peer and receives from another), and two steps posted at once would
    # put two messages on the same link at the same time.
    pending = post(1) if world > 1 else ([], None)

    out = torch.empty((n, heads, dim), dtype=ct, device=q.device)
    lse = torch.empty((n, heads), dtype=ct, device=q.device)
    if n:
        qs = (q.to(ct) * (1.0 / math.sqrt(dim))).view(n, kv_heads, group, dim)
        m_run = torch.full((heads, n), float("-inf"), dtype=ct, device=q.device)
        l_run = torch.zeros((heads, n), dtype=ct, device=q.device)
        acc = torch.zeros((heads, n, dim), dtype=ct, device=q.device)

        def absorb(block: torch.Tensor, diagonal: bool) -> None:
            """Online softmax: fold one key/value block into the running max, sum and output."""
            nonlocal m_run, l_run, acc
            kb, vb = block[:, :kv_heads].to(ct), block[:, kv_heads:].to(ct)
            m = kb.shape[0]
            s = torch.einsum("nkgd,mkd->kgnm", qs, kb).reshape(heads, n, m)
            if diagonal:  # own block, causal: key j is visible to query i iff j <= i
                s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
            m_new = torch.maximum(m_run, s.amax(dim=-1))  # finite: every row sees at least one key of its own block
            p = torch.exp(s - m_new.unsqueeze(-1))
            alpha = torch.exp(m_run - m_new)
            pv = torch.einsum("kgnm,mkd->kgnd", p.view(kv_heads, group, n, m), vb).reshape(heads, n, dim)
            l_run = l_run * alpha + p.sum(dim=-1)
            acc = acc * alpha.unsqueeze(-1) + pv
            m_run = m_new

        absorb(kv, causal)  # the own block needs no communication: it runs while the first blocks travel
    for t in range(1, world):
        reqs, buf = pending
        for req in reqs:
            req.wait()
        if t + 1 < world:
            pending = post(t + 1)
        if buf is not None:
            absorb(buf, False)
    if n:
        out.copy_((acc / l_run.unsqueeze(-1)).permute(1, 0, 2))
        lse.copy_((m_run + torch.log(l_run)).T)
    return out, lse
