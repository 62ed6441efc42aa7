# Correct but slow: one copy of the token per (token, top-k slot) entry, as a plain all-to-all-v of the expanded
# entries does. A token with three experts on a rank crosses to it three times: with the benchmark's routing
# (4 experts per rank, top-8) about twice the bytes of a dispatch that sends each token to a rank once.
import torch
import torch.distributed as dist


def _exchange(sends, recvs):
    ops = [dist.P2POp(dist.isend, t, p) for t, p in sends if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, p) for t, p in recvs if t.numel()]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def dedup_dispatch(x, topk_idx, experts_per_rank):
    rank, world = dist.get_rank(), dist.get_world_size()
    epr = experts_per_rank
    n_tok, d = x.shape
    dev = x.device
    ids = topk_idx.to(torch.int64)
    tok, slot = (ids >= 0).nonzero(as_tuple=True)      # every entry, in (token, slot) order
    exp = ids[tok, slot]
    owner = exp // epr
    sends_x, sends_meta = [], []
    for p in range(world):
        sel = (owner == p).nonzero().flatten()
        sends_x.append(x.index_select(0, tok[sel]))
        sends_meta.append(torch.stack([tok[sel], slot[sel], exp[sel] % epr], 1).contiguous())
    send_n = torch.tensor([int(t.shape[0]) for t in sends_x], dtype=torch.int64, device=dev)
    recv_n = torch.zeros(world, dtype=torch.int64, device=dev)
    recv_n[rank] = send_n[rank]
    peers = [p for p in range(world) if p != rank]
    _exchange([(send_n[p:p + 1], p) for p in peers], [(recv_n[p:p + 1], p) for p in peers])
    n = recv_n.tolist()
    got_x = [sends_x[rank] if p == rank else x.new_empty((n[p], d)) for p in range(world)]
    got_m = [sends_meta[rank] if p == rank else torch.empty((n[p], 3), dtype=torch.int64, device=dev)
             for p in range(world)]
    _exchange([(sends_x[p], p) for p in peers] + [(sends_meta[p], p) for p in peers],
              [(got_x[p], p) for p in peers] + [(got_m[p], p) for p in peers])
    rows, meta = torch.cat(got_x), torch.cat(got_m)
    src = torch.repeat_interleave(torch.arange(world, device=dev), torch.tensor(n, device=dev),
                                  output_size=rows.shape[0])
    # order by (local expert, source rank, token): rows arrive ordered (source, token), so a stable sort by expert
    order = torch.argsort(meta[:, 2], stable=True)
    counts = torch.bincount(meta[:, 2], minlength=epr)
    return (rows[order], torch.stack([src[order], meta[order, 0], meta[order, 1]], 1), counts)
