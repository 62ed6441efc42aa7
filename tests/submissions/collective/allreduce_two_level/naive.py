# Correct but slow: everything goes through one leader per group (the whole tensor in and out of each leader,
# one message after another), and the leaders swap whole group sums.
import torch
import torch.distributed as dist


def two_level_all_reduce(x: torch.Tensor, group_size: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    g = max(1, min(group_size, world))
    leader = rank - rank % g
    members = list(range(leader, min(leader + g, world)))
    leaders = list(range(0, world, g))
    if rank != leader:
        dist.send(x.detach().contiguous(), leader)
        group_sum, total = torch.empty_like(x), torch.empty_like(x)
        dist.recv(group_sum, leader)
        dist.recv(total, leader)
        return group_sum, total
    group_sum = x.detach().clone()
    buf = torch.empty_like(group_sum)
    for m in members[1:]:
        dist.recv(buf, m)
        group_sum += buf
    total = group_sum.clone()
    sends = [dist.isend(group_sum, o) for o in leaders if o != leader]
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
