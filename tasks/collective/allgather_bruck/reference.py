import functools
import math

import torch
import torch.distributed as dist

# The card's fabric (host-posted-cluster): a message holds its sender's port for GAP_US plus its bytes at BW, and
# arrives LAT_US after it leaves the port.
GAP_US, LAT_US, BW_BYTES_PER_US = 8.0, 3.0, 12500.0


@functools.lru_cache(maxsize=256)
def _plan(world: int, block_bytes: int) -> tuple[tuple[int, int], ...]:
    """The message schedule every rank runs, as (offset, blocks) pairs in posting order.

    Rank r keeps a rotated buffer: slot i holds block (r + i) % world, so it starts with its own block in slot 0.
    Message j sends slots [0, blocks) to rank r - offset, and rank r receives the same message of rank r + offset
    into slots [offset, offset + blocks): the offsets tile 1..world-1. All ranks run the same schedule, so their
    timelines are the same and a message may carry every slot that has arrived by the time the port is free for it,
    or wait for the next arrival to carry more. That is Bruck's concatenation (wait for every arrival: ceil(log2 W)
    rounds of growing blocks) generalised to a port that can post the next message while the last is in flight; a
    branch-and-bound search over "send now or after the next arrival" finds the fastest such schedule on the card's
    model. It matches Bruck at 4, 7 and 8 ranks, takes 27 us instead of 33 at 5 and 30 instead of 33 at 6, and is
    the direct exchange at 3."""
    best: list = [math.inf, ()]

    def search(msgs: tuple, offset: int, free: float) -> None:
        done = max((m[1] for m in msgs), default=0.0)
        if offset >= world:
            if done < best[0] - 1e-9:
                best[0], best[1] = done, msgs
            return
        if max(done, free) + GAP_US + LAT_US >= best[0] - 1e-9:
            return
        for start in sorted({free} | {m[1] for m in msgs if m[1] > free}):
            held = 1 + sum(m[2] for m in msgs if m[1] <= start)
            n = min(held, world - offset)
            busy = GAP_US + n * block_bytes / BW_BYTES_PER_US
            search(msgs + ((offset, start + busy + LAT_US, n),), offset + n, start + busy)

    search((), 1, 0.0)
    return tuple((off, n) for off, _, n in best[1])


def all_gather(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    m = x.shape[0]
    if world == 1 or x.numel() == 0:
        return x.detach().clone().reshape(world * m, *x.shape[1:])
    buf = torch.empty((world, *x.shape), dtype=x.dtype, device=x.device)  # slot i: block (rank + i) % world
    buf[0].copy_(x)
    plan = _plan(world, x.numel() * x.element_size())
    recvs = [dist.irecv(buf[off:off + n], (rank + off) % world) for off, n in plan]
    waited = [False] * len(plan)
    sends = []
    for off, n in plan:
        for i, (o2, _) in enumerate(plan):  # slots [1, n) must have arrived before they go out again
            if o2 < n and not waited[i]:
                recvs[i].wait()
                waited[i] = True
        sends.append(dist.isend(buf[:n], (rank - off) % world))
    for i, req in enumerate(recvs):
        if not waited[i]:
            req.wait()
    for req in sends:
        req.wait()
    # the final rotation: slot i is block (rank + i) % world
    return torch.roll(buf, rank, 0).reshape(world * m, *x.shape[1:])
