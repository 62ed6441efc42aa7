import math

import torch
import torch.distributed as dist

# The eight directions data travels in, (di, dj). Several of them can connect the same two ranks (2 x 1 periodic
# grid: "above", "below" and all four corners are the same rank; with 2 columns "left" and "right" are), so the
# pieces for one neighbour are packed into one message, in this order of directions on both sides.
DIRS = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]


def grid(world: int) -> tuple[int, int]:
    py = max(d for d in range(1, math.isqrt(world) + 1) if world % d == 0)
    return world // py, py


def _edge(n: int, h: int, d: int) -> slice:
    """The cells of a tile side of length n that travel in direction d (-1: the first h, +1: the last h)."""
    return slice(0, h) if d < 0 else slice(n - h, n) if d > 0 else slice(0, n)


def _halo(n: int, h: int, d: int) -> slice:
    """Where cells that travelled in direction d land in the framed output (coming from the -d side)."""
    return slice(n + h, n + 2 * h) if d < 0 else slice(0, h) if d > 0 else slice(h, h + n)


def halo_exchange_2d(tile: torch.Tensor, halo: int, periodic: bool) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    px, py = grid(world)
    i, j = divmod(rank, py)
    H, W = tile.shape
    h = halo
    src = tile.detach()
    out = (torch.empty if periodic else torch.zeros)((H + 2 * h, W + 2 * h), dtype=tile.dtype, device=tile.device)
    out[h:h + H, h:h + W].copy_(src)
    if h == 0:
        return out

    def neighbour(di: int, dj: int) -> int | None:
        a, b = i + di, j + dj
        if periodic:
            return (a % px) * py + b % py
        return a * py + b if 0 <= a < px and 0 <= b < py else None

    # Per neighbour rank: the pieces this rank sends it and the output regions its pieces land in, both in DIRS
    # order. Rank a sends in direction d to b exactly when b receives from a in direction d, so the two lists of a
    # pair hold the same directions in the same order: one packed message each way, its size known to both.
    outgoing: dict[int, list[torch.Tensor]] = {}
    incoming: dict[int, list[torch.Tensor]] = {}
    for di, dj in DIRS:
        dst, frm = neighbour(di, dj), neighbour(-di, -dj)
        part = src[_edge(H, h, di), _edge(W, h, dj)]
        region = out[_halo(H, h, di), _halo(W, h, dj)]
        if dst == rank:  # a 1-column grid, periodic: the left and right neighbours are this rank itself
            region.copy_(part)
            continue
        if dst is not None:
            outgoing.setdefault(dst, []).append(part.reshape(-1))
        if frm is not None:
            incoming.setdefault(frm, []).append(region)
    # One batch: every neighbour's message in flight at once, each rank's sends back to back on its outgoing port
    # while its receives arrive on the incoming one; one message per neighbour pays the per-message cost once.
    ops, landing = [], []
    # neighbours in the order of their first direction: in a periodic grid every rank's k-th message then goes the
    # same way (a shift of the grid), so no two ranks send to the same receiver at once
    for peer, parts in outgoing.items():
        ops.append(dist.P2POp(dist.isend, torch.cat(parts), peer))
    for peer, regions in incoming.items():
        buf = torch.empty(sum(r.numel() for r in regions), dtype=out.dtype, device=out.device)
        ops.append(dist.P2POp(dist.irecv, buf, peer))
        landing.append((regions, buf))
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    for regions, buf in landing:  # unpack: the side halos and corners are strided regions of `out`
        for region, piece in zip(regions, torch.split(buf, [r.numel() for r in regions])):
            region.copy_(piece.view(region.shape))
    return out
