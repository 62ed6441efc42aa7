import bisect

import torch
import torch.distributed as dist

# Two exchanges, each key moving about once.
#
# 1. Every rank sorts its keys by (key, index) and sends every peer the same fixed-size header: its count n and
#    K regular samples, the keys at sorted positions q_j = (j + 1) n // (K + 1) with their indices; a rank with
#    at most K keys sends all of them instead (they are then their own samples, and nobody needs them again).
# 2. From the samples every rank bounds, for any sample triple u = (key, rank, index), how many keys of each
#    source lie below it: between two consecutive samples of a source, at most its sample gap; exactly at its
#    own samples. Summed: L(u) <= pos(u) <= H(u). For the boundary T_b = b N // W, lo_b = the largest sample
#    with H <= T_b and hi_b = the smallest with L >= T_b: every key of rank d's target positions
#    T_d .. T_{d+1} - 1 lies in [lo_d, hi_{d+1}), a public interval that overshoots the target only by the
#    samples' uncertainty. Each source sends rank d its keys in that interval, with the exact count of its keys
#    below lo_d; the message is padded to a size every rank can compute from the samples (the most keys the
#    source can hold there), so the receiver posts exact receives without a round of counts. The receiver adds
#    the counts below lo_d (the global position of its interval's start), merges the runs and keeps exactly its
#    target positions. No final rebalance: the keys near a boundary go to both neighbours, and each keeps its
#    own.
#
# Ordering: (key, source rank, source index). Runs from sources concatenated in rank order, each sorted by (key,
# index), are put in that order by a stable sort on the key alone. Keys travel as int32 words (8 bytes of key,
# 4 of index) behind a 16-byte header. On the modelled CPU fabric the sends of the second exchange are ordered by a
# plan every rank computes alike from the public sizes, timed on the link model (see plan_sends).

K = 512  # samples per rank
BW, OVER, ALPHA = 370e3, 0.5, 2.0  # the link model: bytes per us, us of the sender's port and of flight per message


def _exchange(ops) -> None:
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def _free(busy: list, t: float, span: float) -> float:
    i = bisect.bisect_right(busy, (t, float("inf"))) - 1
    for s, e in busy[max(i, 0):]:
        if s >= t + span:
            break
        if e > t:
            return e
    return t


def _makespan(vol: list[list[int]], orders: list[list[int]]) -> float:
    """When the last message arrives, ranks posting in rank order, each message at the earliest time its sender's
    and its receiver's ports are both free for it."""
    world = len(vol)
    egress, ingress = [[] for _ in range(world)], [[] for _ in range(world)]
    last = 0.0
    for r in range(world):
        for d in orders[r]:
            b = vol[r][d] / BW
            t = 0.0
            while True:
                u = max(_free(egress[r], t, b + OVER), _free(ingress[d], t, b))
                if u <= t:
                    break
                t = u
            bisect.insort(egress[r], (t, t + b + OVER))
            bisect.insort(ingress[d], (t, t + b))
            last = max(last, t + b + OVER + ALPHA)
    return last


def plan_sends(vol: list[list[int]], budget: int = 3000) -> list[list[int]]:
    """Every rank's order of sends (vol[s][d] = bytes from s to d): the best of a few fixed orders on the link
    model, improved by swapping pairs of a rank's sends. A fixed order (rank + 1, rank + 2, ...) keeps a busy
    sender waiting on receivers that lighter senders hold."""
    world = len(vol)
    peers = [[d for d in range(world) if d != r and vol[r][d]] for r in range(world)]
    floor = ALPHA + max([sum(vol[r]) / BW + OVER * len(peers[r]) for r in range(world)]
                        + [sum(vol[s][d] for s in range(world)) / BW + OVER for d in range(world)])
    starts = [[sorted(p, key=lambda d: (d - r) % world) for r, p in enumerate(peers)],
              [sorted(p, key=lambda d: (r - d) % world) for r, p in enumerate(peers)],
              [sorted(p) for p in peers], [sorted(p, reverse=True) for p in peers],
              [sorted(p, key=lambda d: -vol[r][d]) for r, p in enumerate(peers)]]
    best, cost = starts[0], float("inf")
    for orders in starts:
        c = _makespan(vol, orders)
        budget -= 1
        improved = True
        while improved and budget > 0 and c > floor + 1e-6:
            improved = False
            for o in orders:
                for i in range(len(o)):
                    for j in range(i + 1, len(o)):
                        o[i], o[j] = o[j], o[i]
                        t = _makespan(vol, orders)
                        budget -= 1
                        if t < c - 1e-9:
                            c, improved = t, True
                        else:
                            o[i], o[j] = o[j], o[i]
        if c < cost:
            best, cost = orders, c
        if cost <= floor + 1e-6 or budget <= 0:
            break
    return best


def _below(sk: torch.Tensor, si: torch.Tensor, s: int, t, upper: bool) -> int:
    """How many keys of source s (sorted by (key, index): sk, si) are below the triple t (None: unbounded, below
    or above all keys as `upper` says)."""
    if t is None:
        return sk.numel() if upper else 0
    k, r, i = t
    q = torch.tensor([k], dtype=torch.int64, device=sk.device)
    if r != s:
        return int(torch.searchsorted(sk, q, right=r > s))
    lo, hi = int(torch.searchsorted(sk, q)), int(torch.searchsorted(sk, q, right=True))
    return lo + int(torch.searchsorted(si[lo:hi], torch.tensor([i], dtype=si.dtype, device=si.device)))


def sample_sort(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = keys.device
    keys = keys.detach().reshape(-1)
    n = keys.numel()
    sk, si = torch.sort(keys, stable=True)  # by (key, index)
    if world == 1:
        return sk, torch.zeros(n, dtype=torch.int64, device=dev), si

    # ---- exchange 1: counts and samples (or whole inputs of at most K keys) ------------------------------------
    heads = torch.zeros((world, 1 + 2 * K), dtype=torch.int64, device=dev)
    heads[rank, 0] = n
    if n <= K:
        heads[rank, 1:1 + n] = keys
    else:
        pos = (torch.arange(1, K + 1, device=dev) * n) // (K + 1)
        heads[rank, 1:1 + K] = sk[pos]
        heads[rank, 1 + K:] = si[pos]
    order = [((rank + t) % world, (rank - t) % world) for t in range(1, world)]
    _exchange([op for dst, src in order for op in (dist.P2POp(dist.isend, heads[rank], dst),
                                                   dist.P2POp(dist.irecv, heads[src], src))])
    counts = heads[:, 0].tolist()
    total = sum(counts)
    targets = [b * total // world for b in range(world + 1)]
    lo_t, hi_t = targets[rank], targets[rank + 1]
    if total == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        return empty, empty.clone(), empty.clone()

    # every source's samples, sorted by (key, index), with their positions in the source's sorted keys
    full = [c <= K for c in counts]
    samp_k, samp_i, samp_q, whole = [], [], [], {}
    for s in range(world):
        c = counts[s]
        if full[s]:
            k_s, i_s = (sk, si) if s == rank else torch.sort(heads[s, 1:1 + c], stable=True)
            whole[s] = (k_s, i_s)
            samp_k.append(k_s)
            samp_i.append(i_s)
            samp_q.append(torch.arange(c, device=dev))
        else:
            samp_k.append(heads[s, 1:1 + K])
            samp_i.append(heads[s, 1 + K:])
            samp_q.append((torch.arange(1, K + 1, device=dev) * c) // (K + 1))

    # candidate cut points: every sample, in the total order
    uk = torch.cat(samp_k)
    ur = torch.cat([torch.full((t.numel(),), s, dtype=torch.int64, device=dev) for s, t in enumerate(samp_k)])
    ui = torch.cat(samp_i)
    uj = torch.cat([torch.arange(t.numel(), device=dev) for t in samp_k])  # index among its source's samples
    o1 = torch.sort(ur * (1 << 40) + ui, stable=True).indices
    o = o1[torch.sort(uk[o1], stable=True).indices]
    uk, ur, ui, uj = uk[o], ur[o], ui[o], uj[o]
    low = torch.zeros_like(uk)
    high = torch.zeros_like(uk)
    for s in range(world):
        ks, qs = samp_k[s], samp_q[s]
        j = torch.where(ur < s, torch.searchsorted(ks, uk), torch.searchsorted(ks, uk, right=True))
        own = ur == s
        j = torch.where(own, uj, j)
        qpad = torch.cat([qs, torch.tensor([counts[s]], device=dev)])
        lo_s = torch.where(j > 0, qpad[(j - 1).clamp_min(0)] + 1, torch.zeros_like(j))
        hi_s = qpad[j]
        low += torch.where(own, hi_s, lo_s)
        high += hi_s

    def triple(x: int):
        return int(uk[x]), int(ur[x]), int(ui[x])

    # the public interval [cut_lo[d], cut_hi[d]) of every rank's target (None: unbounded)
    nu = uk.numel()
    cut_lo, cut_hi = [None] * world, [None] * world
    for b in range(1, world):
        x = int(torch.searchsorted(high, torch.tensor([targets[b]], device=dev), right=True)) - 1
        cut_lo[b] = triple(x) if x >= 0 else None
        y = int(torch.searchsorted(low, torch.tensor([targets[b]], device=dev)))
        cut_hi[b - 1] = triple(y) if y < nu else None

    def bounds(s: int, t, upper: bool) -> int:
        """The fewest (or most) keys of source s below the triple t that its samples allow."""
        if t is None:
            return counts[s] if upper else 0
        k, r, i = t
        ks, qs = samp_k[s], samp_q[s]
        m = ks.numel()
        q = torch.tensor([k], device=dev)
        if r == s:  # t is one of s's samples: its position is exact
            j, e = int(torch.searchsorted(ks, q)), int(torch.searchsorted(ks, q, right=True))
            j += int(torch.searchsorted(samp_i[s][j:e], torch.tensor([i], device=dev)))
            return int(qs[j])
        j = int(torch.searchsorted(ks, q, right=r > s))
        if upper:
            return int(qs[j]) if j < m else counts[s]
        return int(qs[j - 1]) + 1 if j > 0 else 0

    # capacity of every message (public): source s, destination d
    cap = [[0] * world for _ in range(world)]
    for d in range(world):
        if targets[d] == targets[d + 1]:
            continue
        for s in range(world):
            if s != d and not full[s]:
                cap[s][d] = bounds(s, cut_hi[d], True) - bounds(s, cut_lo[d], False)

    # ---- exchange 2: every key to its destination (to both, near a boundary) -----------------------------------
    vol = [[(4 + 3 * cap[s][d]) * 4 if cap[s][d] else 0 for d in range(world)] for s in range(world)]
    if dev.type == "cpu":  # the modelled fabric: plan the order (its sizes change with the data, so a short search)
        plan = plan_sends(vol, budget=300)
    else:  # NCCL shares a link between the messages on it: the order matters little, and planning costs time
        plan = [[(r + t) % world for t in range(1, world) if vol[r][(r + t) % world]] for r in range(world)]
    ops, inbox = [], {}
    for d in plan[rank]:
        a, b = _below(sk, si, rank, cut_lo[d], False), _below(sk, si, rank, cut_hi[d], True)
        c = cap[rank][d]
        buf = torch.empty(4 + 3 * c, dtype=torch.int32, device=dev)
        buf[:4].view(torch.int64).copy_(torch.tensor([a, b - a], device=dev))
        buf[4:4 + 2 * c].view(torch.int64)[:b - a] = sk[a:b]
        buf[4 + 2 * c:4 + 2 * c + b - a] = si[a:b].to(torch.int32)
        ops.append(dist.P2POp(dist.isend, buf, d))
    for s in range(world):
        if cap[s][rank]:
            inbox[s] = torch.empty(4 + 3 * cap[s][rank], dtype=torch.int32, device=dev)
            ops.append(dist.P2POp(dist.irecv, inbox[s], s))
    _exchange(ops)
    if lo_t == hi_t:
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        return empty, empty.clone(), empty.clone()

    # ---- merge: the runs of every source in my interval, in source order ----------------------------------------
    base = 0
    run_k, run_r, run_i = [], [], []
    for s in range(world):
        if s in inbox:
            c = cap[s][rank]
            a, cnt = inbox[s][:4].view(torch.int64).tolist()
            k_s = inbox[s][4:4 + 2 * c].view(torch.int64)[:cnt]
            i_s = inbox[s][4 + 2 * c:4 + 2 * c + cnt].to(torch.int64)
        elif s == rank or full[s]:
            k_all, i_all = (sk, si) if s == rank else whole[s]
            a, b = _below(k_all, i_all, s, cut_lo[rank], False), _below(k_all, i_all, s, cut_hi[rank], True)
            cnt = b - a
            k_s, i_s = k_all[a:b], i_all[a:b]
        else:  # nothing of s can lie in my interval: its count below it is known exactly
            a, cnt = bounds(s, cut_lo[rank], False), 0
            k_s = i_s = torch.zeros(0, dtype=torch.int64, device=dev)
        base += a
        run_k.append(k_s)
        run_r.append(torch.full((cnt,), s, dtype=torch.int64, device=dev))
        run_i.append(i_s)
    mk = torch.cat(run_k)
    o = torch.sort(mk, stable=True).indices[lo_t - base:hi_t - base]
    return mk[o], torch.cat(run_r)[o], torch.cat(run_i)[o]
