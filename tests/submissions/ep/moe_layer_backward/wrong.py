# Plausible bug: w2's gradient sums h^T dy over the expert's rows, forgetting that each row's output was scaled
# by its gate before the combine (right only where every gate is 1, as with top-1); dx, dgates, dw1 and dw3 are
# right.
import torch
import torch.distributed as dist
import torch.nn.functional as F


def _post(sends: list, recvs: list) -> list:
    """Post every (tensor, peer) send and receive at once, empty ones skipped (both sides know the sizes, so they
    skip the same messages); the receives' requests come last, in their order."""
    ops = [dist.P2POp(dist.isend, t, p) for t, p in sends if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, p) for t, p in recvs if t.numel()]
    return dist.batch_isend_irecv(ops) if ops else []


def moe_layer_backward(x: torch.Tensor, topk_idx: torch.Tensor, gates: torch.Tensor, dy: torch.Tensor,
                       w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    epr, d = w1.shape[0], x.shape[1]
    t = x.shape[0]
    n_exp = world * epr
    dev = x.device

    # 1. the gates as a dense [T, world, epr] matrix (0: not chosen; chosen gates are > 0); the -1 entries point at
    #    an extra column that is dropped
    col = torch.where(topk_idx >= 0, topk_idx, n_exp)
    dense = x.new_zeros((t, n_exp + 1)).scatter_(1, col, gates)[:, :n_exp].view(t, world, epr)

    # 2. counts, then the dispatch: each token once to each rank hosting one of its experts, with its upstream
    #    gradient and its gates for that rank's experts (one [n, 2d + epr] message per peer)
    send_idx = [(dense[:, p] > 0).any(1).nonzero()[:, 0] for p in range(world)]
    payload = [torch.cat([x[i], dy[i], dense[i, p]], 1) for p, i in enumerate(send_idx)]
    counts = torch.tensor([i.numel() for i in send_idx], dtype=torch.int64, device=dev)
    n_in = torch.empty_like(counts)
    n_in[rank] = counts[rank]
    to = [(rank + i) % world for i in range(world)]      # step i: I send to rank + i ...
    frm = [(rank - i) % world for i in range(world)]     # ... and receive from rank - i (its step i sends to me)
    for req in _post([(counts[p:p + 1], p) for p in to[1:]], [(n_in[p:p + 1], p) for p in frm[1:]]):
        req.wait()
    n_in = n_in.tolist()
    recv = [x.new_empty((n_in[p], 2 * d + epr)) for p in range(world)]
    recv[rank] = payload[rank]
    reqs = _post([(payload[p], p) for p in to[1:]], [(recv[p], p) for p in frm[1:]])
    recv_req = dict(zip([p for p in frm[1:] if n_in[p]], reqs[len(reqs) - sum(1 for p in frm[1:] if n_in[p]):]))

    # 3. per source, as its rows arrive: every local expert once on the rows that chose it (forward recomputed),
    #    the weight gradients accumulated, and one [n, d + epr] row per token back (dx summed over this rank's
    #    experts, and the gate gradients of its experts). Step i returns rank - i's rows and receives my own rows
    #    from rank + i, so every rank's step-i exchange matches its peers' (no rank waits on a later step).
    dw1, dw3, dw2 = torch.zeros_like(w1), torch.zeros_like(w3), torch.zeros_like(w2)

    def experts(rows: torch.Tensor) -> torch.Tensor:
        xin, gin, g = rows[:, :d], rows[:, d:2 * d], rows[:, 2 * d:]
        back = x.new_zeros((rows.shape[0], d + epr))
        for l in range(epr):
            sel = (g[:, l] > 0).nonzero()[:, 0]
            if not sel.numel():
                continue
            xe, gy = xin.index_select(0, sel), gin.index_select(0, sel)
            a, b = xe @ w1[l], xe @ w3[l]
            sig = torch.sigmoid(a)
            sa = a * sig
            h = sa * b
            back[sel, d + l] = ((h @ w2[l]) * gy).sum(1)
            gyw = gy * g.index_select(0, sel)[:, l:l + 1]
            dh = gyw @ w2[l].T
            dw2[l].addmm_(h.T, gy)  # BUG: the upstream gradient without its gate
            da = dh * b * sig * (1 + a * (1 - sig))
            db = dh * sa
            dw1[l].addmm_(xe.T, da)
            dw3[l].addmm_(xe.T, db)
            back[:, :d].index_add_(0, sel, torch.addmm(db @ w3[l].T, da, w1[l].T))
        return back

    ret = [x.new_empty((int(counts[p]), d + epr)) for p in range(world)]
    ret[rank] = experts(payload[rank])
    pending = []
    for i in range(1, world):
        src, dst = frm[i], to[i]
        if src in recv_req:
            recv_req[src].wait()
        back = experts(recv[src]) if n_in[src] else x.new_empty((0, d + epr))
        pending += _post([(back, src)], [(ret[dst], dst)])
    for req in reqs + pending:
        req.wait()

    # 4. at the source: dx adds up the ranks' partial sums; dgates picks each entry's expert (0 for -1 entries)
    dx = torch.zeros_like(x)
    dd = x.new_zeros((t, world, epr))
    for p in range(world):
        if send_idx[p].numel():
            dx.index_add_(0, send_idx[p], ret[p][:, :d])
            dd[send_idx[p], p] = ret[p][:, d:]
    dgates = torch.cat([dd.view(t, n_exp), dd.new_zeros((t, 1))], 1).gather(1, col)
    return dx, dgates, dw1, dw3, dw2
