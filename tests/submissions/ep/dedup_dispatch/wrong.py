# Plausible bug: the token crosses to each rank once, as it should, but its metadata carries only ONE local
# expert (the first slot that names one of the destination's experts). The receiver then hands the token to that
# expert only: a token with two or more experts on a rank is missing from the other experts' batches.
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
    k = topk_idx.shape[1]
    dev = x.device
    ids = topk_idx.to(torch.int64)
    owner = torch.where(ids >= 0, ids // epr, -1)
    sends_x, sends_meta = [], []
    for p in range(world):
        mine = owner == p
        tok = mine.any(1).nonzero().flatten()
        first = torch.argmax(mine[tok].to(torch.int8), 1)  # BUG: only the first slot on p, not all of them
        sends_x.append(x.index_select(0, tok))
        sends_meta.append(torch.stack([tok, first, ids[tok, first] % epr], 1).contiguous())
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
    order = torch.argsort(meta[:, 2], stable=True)
    counts = torch.bincount(meta[:, 2], minlength=epr)
    return (rows[order], torch.stack([src[order], meta[order, 0], meta[order, 1]], 1), counts)
