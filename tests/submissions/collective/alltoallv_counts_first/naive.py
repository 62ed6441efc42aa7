# Correct but slow: one blocking exchange per peer and per phase, W - 1 rounds of counts (each costing a whole
# latency) before the rows even start.
import torch
import torch.distributed as dist


def all_to_all_v(x: torch.Tensor, send_counts: list[int]):
    rank, world = dist.get_rank(), dist.get_world_size()
    recv = [0] * world
    recv[rank] = send_counts[rank]
    for s in range(1, world):
        dst, src = (rank + s) % world, (rank - s) % world
        out = torch.tensor([send_counts[dst]], dtype=torch.int64, device=x.device)
        inc = torch.empty(1, dtype=torch.int64, device=x.device)
        for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, dst), dist.P2POp(dist.irecv, inc, src)]):
            req.wait()
        recv[src] = int(inc.item())
    soff = [sum(send_counts[:j]) for j in range(world + 1)]
    parts = []
    for s in range(world):
        if s == rank:
            parts.append(x[soff[rank]:soff[rank + 1]].clone())
            continue
        buf = x.new_empty((recv[s], *x.shape[1:]))
        parts.append(buf)
    for s in range(1, world):
        dst, src = (rank + s) % world, (rank - s) % world
        ops = []
        if send_counts[dst]:
            ops.append(dist.P2POp(dist.isend, x[soff[dst]:soff[dst + 1]].contiguous(), dst))
        if recv[src]:
            ops.append(dist.P2POp(dist.irecv, parts[src], src))
        for req in dist.batch_isend_irecv(ops) if ops else []:
            req.wait()
    return torch.cat(parts), recv
