import functools
import math

import torch
import torch.distributed as dist

# The card's fabric (host-posted-cluster): a message holds its sender's port for GAP_US plus its bytes at BW, and
# arrives LAT_US after it leaves the port.
GAP_US, LAT_US, BW_BYTES_PER_US = 8.0, 3.0, 12500.0


def _radix_orders(world: int) -> list[tuple[int, ...]]:
    """Every sequence of radices (each >= 2) whose product first reaches `world` at its last entry."""
    out = []

    def grow(seq: tuple, prod: int) -> None:
        if prod >= world:
            out.append(seq)
            return
        for r in range(2, world + 1):
            grow(seq + (r,), prod * r)

    grow((), 1)
    return out


def _messages(world: int, radices: tuple[int, ...]) -> list[tuple[tuple[int, ...], int, frozenset]]:
    """Bruck's log-step all-to-all in mixed radix: slot i of a rank's buffer holds the block bound for the rank
    i ahead, and writing i with the radices' digits, round k sends every slot whose digit k is v (v = 1 .. r_k - 1)
    v * stride_k ranks ahead, where the block stays in slot i; after the last round it has moved i ranks. Each
    message is (slots, shift, the earlier messages whose receives filled those slots)."""
    msgs, last, stride = [], {}, 1
    for r in radices:
        filled = {}
        for v in range(1, r):
            slots = tuple(i for i in range(world) if (i // stride) % r == v)
            if slots:
                msgs.append((slots, v * stride, frozenset(last[i] for i in slots if i in last)))
                filled.update((i, len(msgs) - 1) for i in slots)
        last.update(filled)
        stride *= r
    return msgs


@functools.lru_cache(maxsize=256)
def _plan(world: int, block_bytes: int) -> tuple[tuple[tuple[int, ...], int, tuple[int, ...]], ...]:
    """The fastest schedule on the card's model: over every radix order (radix 2 everywhere is Bruck's; radix W is
    the direct exchange) and every posting order of its messages. All ranks run the same schedule, so one rank's
    timeline stands for all: a message leaves when the port is free and its slots have arrived, and the port is
    idle while a message is in flight, so a message that needs no arrival (the slots of a digit that no earlier
    round touched) fills the gap. Returns (slots, shift, indices in the returned order of the messages it waits
    for), in posting order."""
    best: list = [math.inf, None, None]
    for radices in _radix_orders(world):
        msgs = _messages(world, radices)

        def search(order: list, arrive: dict, free: float) -> None:
            done = max(arrive.values(), default=0.0)
            if done >= best[0] - 1e-9 and len(order) < len(msgs):
                return
            if len(order) == len(msgs):
                if done < best[0] - 1e-9:
                    best[0], best[1], best[2] = done, msgs, tuple(order)
                return
            for j, (slots, _, deps) in enumerate(msgs):
                if j in arrive or not deps <= arrive.keys():
                    continue
                start = max([free] + [arrive[d] for d in deps])
                busy = GAP_US + len(slots) * block_bytes / BW_BYTES_PER_US
                arrive[j] = start + busy + LAT_US
                search(order + [j], arrive, start + busy)
                del arrive[j]

        search([], {}, 0.0)
    msgs, order = best[1], best[2]
    where = {j: n for n, j in enumerate(order)}
    return tuple((msgs[j][0], msgs[j][1], tuple(sorted(where[d] for d in msgs[j][2]))) for j in order)


def all_to_all(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1 or x.numel() == 0:
        return x.detach().clone()
    blocks = x.detach().reshape(world, -1)  # block j: the rows for rank j, as one flat row
    # the initial rotation: slot i holds the block bound for rank (rank + i) % world
    buf = torch.roll(blocks, -rank, 0).contiguous()
    plan = _plan(world, blocks.shape[1] * x.element_size())
    idx = [torch.tensor(slots, dtype=torch.long) for slots, _, _ in plan]
    incoming = [buf.new_empty((len(slots), buf.shape[1])) for slots, _, _ in plan]
    recvs = [dist.irecv(t, (rank - shift) % world) for t, (_, shift, _) in zip(incoming, plan)]
    landed = [False] * len(plan)

    def land(j: int) -> None:  # a receive's blocks go into their slots once it is needed
        if not landed[j]:
            recvs[j].wait()
            buf[idx[j]] = incoming[j]
            landed[j] = True

    sends = []
    for j, (_, shift, deps) in enumerate(plan):
        for d in deps:
            land(d)
        out = buf.index_select(0, idx[j])  # packed: the slots are not contiguous; kept alive until sent
        sends.append((dist.isend(out, (rank + shift) % world), out))
    for j in range(len(plan)):
        land(j)
    for req, _ in sends:
        req.wait()
    # the final rotation: slot i now holds the block that rank (rank - i) % world addressed to this rank
    src = torch.tensor([(rank - s) % world for s in range(world)], dtype=torch.long)
    return buf.index_select(0, src).reshape(x.shape)
