# Leader-based two-level all-reduce with an aliasing bug: the leader adds the other groups' sums into the very
# tensor that holds its group's sum, so every rank gets the total twice and never its group's sum.
import torch
import torch.distributed as dist


def two_level_all_reduce(x: torch.Tensor, group_size: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    g = max(1, min(group_size, world))
    leader = rank - rank % g
    members = list(range(leader, min(leader + g, world)))
    leaders = list(range(0, world, g))
    acc = x.detach().clone()
    if rank != leader:
        dist.send(acc, leader)
        group_sum, total = torch.empty_like(acc), torch.empty_like(acc)
        dist.recv(group_sum, leader)
        dist.recv(total, leader)
        return group_sum, total
    buf = torch.empty_like(acc)
    for m in members[1:]:
        dist.recv(buf, m)
        acc += buf
    group_sum = acc
    total = acc  # bug: must be acc.clone()
    sends = [dist.isend(group_sum.clone(), o) for o in leaders if o != leader]
    for o in leaders:
        if o != leader:
            dist.recv(buf, o)
            total += buf
    for s in sends:
        s.wait()
    for m in members[1:]:
        dist.send(group_sum, m)
        dist.send(total, m)
    return group_sum, total
