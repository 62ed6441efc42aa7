# Plausible bug: sender and receiver disagree on the order of the experts inside one message.
# The sender packs them in its OLD slot order, the receiver unpacks them in its NEW slot order,
# so whenever two or more experts move between the same pair of ranks they can land in swapped slots.
import torch
import torch.distributed as dist


def rebalance(weights, old_placement, new_placement):
    rank, world = dist.get_rank(), dist.get_world_size()
    k = weights.shape[0]
    new = new_placement.reshape(-1)
    dest = torch.empty_like(new)
    dest[new] = torch.arange(new.numel())          # expert id -> new flat position
    my_dest_rank = dest[old_placement[rank]] // k    # where each of my slots goes
    old = old_placement.reshape(-1)
    where = torch.empty_like(old)
    where[old] = torch.arange(old.numel())
    src_rank = where[new_placement[rank]] // k       # where each of my new slots comes from
    src_slot = where[new_placement[rank]] % k
    out = torch.empty_like(weights)
    reqs, recvs = [], []
    for peer in range(world):
        if peer == rank:
            continue
        send_slots = (my_dest_rank == peer).nonzero().reshape(-1)   # ascending old slot order
        if send_slots.numel():
            reqs.append(dist.isend(weights.index_select(0, send_slots).contiguous(), peer))
        recv_slots = (src_rank == peer).nonzero().reshape(-1)       # ascending new slot order
        if recv_slots.numel():
            buf = weights.new_empty((recv_slots.numel(), *weights.shape[1:]))
            reqs.append(dist.irecv(buf, peer))
            recvs.append((recv_slots, buf))
    stay = (src_rank == rank).nonzero().reshape(-1)
    out[stay] = weights.index_select(0, src_slot[stay])
    for r in reqs:
        r.wait()
    for slots, buf in recvs:
        out[slots] = buf
    return out
