import torch
import torch.distributed as dist


def rebalance(weights: torch.Tensor, old_placement: torch.Tensor, new_placement: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    k = weights.shape[0]
    dev = weights.device
    # The plan depends only on the placements (small integer tables, identical on every rank): work it out on the
    # CPU, then move just the index lists to the weights' device.
    old = old_placement.reshape(-1).to("cpu", torch.int64)
    new = new_placement.reshape(world, k).to("cpu", torch.int64)
    where = torch.empty_like(old)  # where every expert sits now, as a flat index rank * k + slot
    where[old] = torch.arange(old.numel())
    src = where[new]                                      # [world, k]: old flat index feeding each new slot
    src_rank, src_slot = src // k, src % k

    # Per peer: the slots I send (in the receiver's new slot order, the order both sides agree on) and the new
    # slots I receive into (ascending). All outgoing experts are packed, grouped by peer, with one gather.
    peers = [p for p in range(world) if p != rank]
    send_parts = [src_slot[p][src_rank[p] == rank] for p in peers]
    recv_parts = [(src_rank[rank] == p).nonzero().reshape(-1) for p in peers]
    empty = torch.empty(0, dtype=torch.int64)
    packed = weights.index_select(0, (torch.cat(send_parts) if peers else empty).to(dev))
    recv_slots = torch.cat(recv_parts) if peers else empty
    incoming = weights.new_empty((recv_slots.numel(), *weights.shape[1:]))

    # One batch with every send and receive: the transfers to and from all peers run concurrently, and NCCL
    # issues the batch as one group, so no send waits on a receive queued behind another transfer.
    ops, so, ro = [], 0, 0
    for p, s, r in zip(peers, send_parts, recv_parts):
        if s.numel():
            ops.append(dist.P2POp(dist.isend, packed[so:so + s.numel()], p))
            so += s.numel()
        if r.numel():
            ops.append(dist.P2POp(dist.irecv, incoming[ro:ro + r.numel()], p))
            ro += r.numel()
    reqs = dist.batch_isend_irecv(ops) if ops else []

    # experts that stay on this rank: local copy, overlapped with the transfers
    out = torch.empty_like(weights)
    stay = (src_rank[rank] == rank).nonzero().reshape(-1)
    if stay.numel():
        out[stay.to(dev)] = weights.index_select(0, src_slot[rank][stay].to(dev))
    for req in reqs:
        req.wait()
    if recv_slots.numel():
        out[recv_slots.to(dev)] = incoming
    return out
