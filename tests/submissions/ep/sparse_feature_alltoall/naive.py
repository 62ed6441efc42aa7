# Correct but slow: TorchRec's recipe taken literally, one library all-to-all per tensor: the batch sizes and id
# counts, then the lengths, then the ids (three rounds where two suffice, each paying an all-to-all's latency),
# then the re-ordering from (source, feature) to (feature, source) on the receiver.
import torch
import torch.distributed as dist


def sparse_feature_alltoall(lengths, values, feature_owner):
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = lengths.device
    owner = feature_owner.to(device=dev, dtype=torch.int64)
    n_feat = owner.numel()
    batch = lengths.numel() // n_feat
    lens = lengths.view(n_feat, batch)
    feats = [(owner == p).nonzero()[:, 0] for p in range(world)]
    ids_per_feat = lens.sum(1, dtype=torch.int64).tolist()
    by_feat = list(torch.split(values, ids_per_feat))

    # round 1: (batch, id count) per destination
    meta = torch.tensor([[batch, sum(ids_per_feat[f] for f in fs.tolist())] for fs in feats], dtype=torch.int64,
                        device=dev)
    peer = torch.empty_like(meta)
    dist.all_to_all_single(peer, meta)
    src_batch, src_ids = peer[:, 0].tolist(), peer[:, 1].tolist()
    mine = feats[rank].numel()

    # round 2: the lengths
    send_l = torch.cat([lens[fs].reshape(-1) for fs in feats])
    recv_l = lengths.new_empty(mine * sum(src_batch))
    dist.all_to_all_single(recv_l, send_l, [mine * b for b in src_batch],
                           [fs.numel() * batch for fs in feats])

    # round 3: the ids
    send_v = torch.cat([values.new_empty(0)] + [by_feat[f] for fs in feats for f in fs.tolist()])
    recv_v = values.new_empty(sum(src_ids))
    dist.all_to_all_single(recv_v, send_v, src_ids, [int(meta[p, 1]) for p in range(world)])

    # re-order: (source, feature, sample) -> (feature, source, sample)
    l_parts = [p.view(mine, b) for p, b in zip(torch.split(recv_l, [mine * b for b in src_batch]), src_batch)]
    v_parts = torch.split(recv_v, src_ids)
    out_l, out_v = [], []
    for j in range(mine):
        for s in range(world):
            out_l.append(l_parts[s][j])
    per_src_feat = [torch.split(v_parts[s], l_parts[s].sum(1, dtype=torch.int64).tolist()) for s in range(world)]
    for j in range(mine):
        for s in range(world):
            out_v.append(per_src_feat[s][j])
    out_lengths = torch.cat(out_l) if out_l else lengths.new_empty(0)
    out_values = torch.cat(out_v) if out_v else values.new_empty(0)
    return out_lengths, out_values
