# Plausible bug: only the four side neighbours are exchanged ("a 5-point stencil is enough"), so the four h x h
# corners of the frame stay zero. Every side halo is right, and h = 0 passes.
import math

import torch
import torch.distributed as dist

DIRS = [(-1, 0), (0, -1), (0, 1), (1, 0)]


def _edge(n, h, d):
    return slice(0, h) if d < 0 else slice(n - h, n) if d > 0 else slice(0, n)


def _halo(n, h, d):
    return slice(n + h, n + 2 * h) if d < 0 else slice(0, h) if d > 0 else slice(h, h + n)


def halo_exchange_2d(tile, halo, periodic):
    rank, world = dist.get_rank(), dist.get_world_size()
    py = max(d for d in range(1, math.isqrt(world) + 1) if world % d == 0)
    px = world // py
    i, j = divmod(rank, py)
    H, W = tile.shape
    h = halo
    out = torch.zeros((H + 2 * h, W + 2 * h), dtype=tile.dtype, device=tile.device)
    out[h:h + H, h:h + W] = tile
    if h == 0:
        return out

    def nb(di, dj):
        a, b = i + di, j + dj
        if periodic:
            return (a % px) * py + b % py
        return a * py + b if 0 <= a < px and 0 <= b < py else None

    ops, land = [], []
    for tag, (di, dj) in enumerate(DIRS):
        dst, frm = nb(di, dj), nb(-di, -dj)
        part = tile[_edge(H, h, di), _edge(W, h, dj)]
        region = out[_halo(H, h, di), _halo(W, h, dj)]
        if dst == rank:
            region.copy_(part)
            continue
        if dst is not None:
            ops.append(dist.P2POp(dist.isend, part.contiguous(), dst, tag=tag))
        if frm is not None:
            buf = torch.empty(region.shape, dtype=tile.dtype, device=tile.device)
            ops.append(dist.P2POp(dist.irecv, buf, frm, tag=tag))
            land.append((region, buf))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    for region, buf in land:
        region.copy_(buf)
    return out
