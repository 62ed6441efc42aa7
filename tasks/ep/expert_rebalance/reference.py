import torch
import torch.distributed as dist


def rebalance(weights: torch.Tensor, old_placement: torch.Tensor, new_placement: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    k = weights.shape[0]
    old = old_placement.reshape(-1).to(torch.int64)
    # where every expert sits now, as a flat index rank * k + slot
    where = torch.empty_like(old)
    where[old] = torch.arange(old.numel())
    src = where[new_placement.to(torch.int64)]            # [world, k]: old flat index feeding each new slot
    src_rank, src_slot = src // k, src % k

    out = torch.empty_like(weights)
    reqs = []
    recvs = []
    for peer in range(world):
        if peer == rank:
            continue
        # agreed order for a (sender, receiver) pair: the receiver's new slot order
        to_peer = src_slot[peer][src_rank[peer] == rank]
        if to_peer.numel():
            reqs.append(dist.isend(weights.index_select(0, to_peer).contiguous(), peer))
        from_peer = (src_rank[rank] == peer).nonzero().reshape(-1)
        if from_peer.numel():
            buf = weights.new_empty((from_peer.numel(), *weights.shape[1:]))
            reqs.append(dist.irecv(buf, peer))
            recvs.append((from_peer, buf))
    # experts that stay on this rank: local copy, overlapped with the transfers
    stay = (src_rank[rank] == rank).nonzero().reshape(-1)
    if stay.numel():
        out[stay] = weights.index_select(0, src_slot[rank][stay])
    for r in reqs:
        r.wait()
    for slots, buf in recvs:
        out[slots] = buf
    return out
