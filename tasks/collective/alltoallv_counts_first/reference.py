import torch
import torch.distributed as dist

# Two exchanges, each posted to every peer at once: the counts (one int64 per peer: they are tiny, so together
# they cost about one latency plus a per-message overhead each), then the rows, received straight into their
# place in the output. Peers are taken in shift order (send to rank + s, receive from rank - s), so that in
# the s-th slot every port carries one message and no receiver is the target of two senders at once.


def _run(ops) -> None:
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def all_to_all_v(x: torch.Tensor, send_counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    counts = torch.tensor(send_counts, dtype=torch.int64, device=x.device)
    recv = torch.empty(world, dtype=torch.int64, device=x.device)
    recv[rank] = counts[rank]
    order = [((rank + s) % world, (rank - s) % world) for s in range(1, world)]
    _run([op for dst, src in order for op in (dist.P2POp(dist.isend, counts[dst:dst + 1], dst),
                                              dist.P2POp(dist.irecv, recv[src:src + 1], src))])
    rc = recv.tolist()

    soff, roff = [0], [0]
    for j in range(world):
        soff.append(soff[-1] + send_counts[j])
        roff.append(roff[-1] + rc[j])
    rows = x.detach().contiguous()
    y = x.new_empty((roff[-1], *x.shape[1:]))
    y[roff[rank]:roff[rank + 1]] = rows[soff[rank]:soff[rank + 1]]
    ops = []
    for dst, src in order:  # a count of 0 on one side is a 0 on the other: both skip that message
        if send_counts[dst]:
            ops.append(dist.P2POp(dist.isend, rows[soff[dst]:soff[dst + 1]], dst))
        if rc[src]:
            ops.append(dist.P2POp(dist.irecv, y[roff[src]:roff[src + 1]], src))
    _run(ops)
    return y, recv
