# Counts first, then rows, in W - 1 pairwise rounds; but the received blocks are concatenated in the order they
# arrived (own rows, then from rank - 1, rank - 2, ...) instead of in source-rank order.
import torch
import torch.distributed as dist


def all_to_all_v(x: torch.Tensor, send_counts: list[int]):
    rank, world = dist.get_rank(), dist.get_world_size()
    counts = torch.tensor(send_counts, dtype=torch.int64, device=x.device)
    recv = torch.empty(world, dtype=torch.int64, device=x.device)
    recv[rank] = counts[rank]
    ops = []
    for j in range(world):
        if j != rank:
            ops.append(dist.P2POp(dist.isend, counts[j:j + 1], j))
            ops.append(dist.P2POp(dist.irecv, recv[j:j + 1], j))
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    rc = recv.tolist()
    soff = [sum(send_counts[:j]) for j in range(world + 1)]
    parts = [x[soff[rank]:soff[rank + 1]].clone()]
    for s in range(1, world):
        dst, src = (rank + s) % world, (rank - s) % world
        buf = x.new_empty((rc[src], *x.shape[1:]))
        ops = []
        if send_counts[dst]:
            ops.append(dist.P2POp(dist.isend, x[soff[dst]:soff[dst + 1]].contiguous(), dst))
        if rc[src]:
            ops.append(dist.P2POp(dist.irecv, buf, src))
        for req in dist.batch_isend_irecv(ops) if ops else []:
            req.wait()
        parts.append(buf)  # bug: arrival order, not source-rank order
    return torch.cat(parts), recv
