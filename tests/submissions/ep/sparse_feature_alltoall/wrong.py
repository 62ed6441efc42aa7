# Plausible bug: the lengths are re-ordered to (feature, source rank, sample), but the ids are returned in the
# order they arrived, grouped by source rank first; everything else is right.
import torch
import torch.distributed as dist


def _exchange(sends: list, recvs: list) -> None:
    """One round: every (tensor, peer) send and receive posted at once; empty ones skipped (both sides know the
    sizes, so they skip the same messages)."""
    ops = [dist.P2POp(dist.isend, t, p) for t, p in sends if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, p) for t, p in recvs if t.numel()]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def _segments(starts: torch.Tensor, sizes: torch.Tensor, total: int) -> torch.Tensor:
    """Positions of the segments [starts[i], starts[i] + sizes[i]) one after the other (a jagged gather index)."""
    shift = starts - (torch.cumsum(sizes, 0) - sizes)
    return torch.repeat_interleave(shift, sizes, output_size=total) + torch.arange(total, device=starts.device)


def sparse_feature_alltoall(lengths: torch.Tensor, values: torch.Tensor,
                            feature_owner: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = lengths.device
    owner = feature_owner.to(device=dev, dtype=torch.int64)
    n_feat = owner.numel()
    batch = lengths.numel() // n_feat
    lens = lengths.view(n_feat, batch)

    # 1. regroup this rank's features by owner (features increasing within an owner): lengths and ids both
    ids_per_feat = lens.sum(1, dtype=torch.int64)
    feat_start = torch.cumsum(ids_per_feat, 0) - ids_per_feat
    order = torch.argsort(owner, stable=True)
    feats_of = torch.bincount(owner, minlength=world).tolist()     # public: every rank computes the same
    ids_by_owner = torch.zeros(world, dtype=torch.int64, device=dev).index_add_(0, owner, ids_per_feat)
    seg = ids_per_feat[order]
    send_vals = values[_segments(feat_start[order], seg, values.numel())]
    send_lens = lens[order]

    # 2. one tiny round: my batch size and my id count for each peer that owns features (the others get nothing)
    ring = [(rank + i) % world for i in range(1, world)]            # peers from my right: no hot receiver
    owners = [p for p in ring if feats_of[p]]
    meta = torch.stack([torch.full_like(ids_by_owner, batch), ids_by_owner], 1)  # [world, 2]
    peer_meta = torch.empty_like(meta)
    peer_meta[rank] = meta[rank]
    mine = feats_of[rank]
    sources = [(rank - i) % world for i in range(1, world)] if mine else []
    _exchange([(meta[p], p) for p in owners], [(peer_meta[p], p) for p in sources])

    # 3. one message per owner: its features' lengths [F_d * B] then their ids, packed
    f_split, v_split = feats_of, ids_by_owner.tolist()
    lens_parts = torch.split(send_lens.reshape(-1), [f * batch for f in f_split])
    vals_parts = torch.split(send_vals, v_split)
    payload = [torch.cat([lp, vp]) for lp, vp in zip(lens_parts, vals_parts)]
    src_meta = peer_meta.tolist() if mine else [[0, 0]] * world
    src_batch = [b for b, _ in src_meta]
    sizes = [mine * b + n for b, n in src_meta]
    buf = lengths.new_empty(sum(sizes))
    recv = list(torch.split(buf, sizes))
    recv[rank].copy_(payload[rank])
    _exchange([(payload[p], p) for p in owners], [(recv[p], p) for p in sources])

    # 4. from (source, feature, sample) to (feature, source, sample): the lengths as a [F_r, B_total] matrix, the
    #    ids as (source, feature) segments re-ordered to (feature, source)
    if mine == 0:
        return lengths.new_empty(0), values.new_empty(0)
    total_b = sum(src_batch)
    sb = torch.tensor(src_batch, dtype=torch.int64, device=dev)
    base = torch.cumsum(torch.tensor(sizes, dtype=torch.int64, device=dev), 0) - torch.tensor(sizes, device=dev)
    src_of_col = torch.repeat_interleave(torch.arange(world, device=dev), sb, output_size=total_b)
    col_in_src = torch.arange(total_b, device=dev) - (torch.cumsum(sb, 0) - sb)[src_of_col]
    feat = torch.arange(mine, device=dev)[:, None]
    out_lens = buf[base[src_of_col] + feat * sb[src_of_col] + col_in_src]          # [F_r, B_total]
    per_sf = torch.zeros((mine, world), dtype=torch.int64, device=dev).index_add_(1, src_of_col,
                                                                                  out_lens.to(torch.int64))
    # BUG: the ids stay in the order they arrived, (source, feature), not (feature, source): right whenever this rank
    # owns one feature, or only one rank has ids for its features
    out_vals = torch.cat([values.new_empty(0)] + [recv[s][mine * src_batch[s]:] for s in range(world)])
    return out_lens.reshape(-1), out_vals
