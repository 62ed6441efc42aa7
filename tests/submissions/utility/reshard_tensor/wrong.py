# WRONG: one packed message per pair of ranks, received straight into row slices, but the grid is numbered
# column-major, (p, q) = (r % pr, r // pr) as BLACS's "C" order does, instead of the row-major
# (r // pc, r % pc) that the task defines.
import torch
import torch.distributed as dist


def _owned(n, block, coord, procs):
    full, rest = divmod(n, block * procs)
    return full * block + min(max(rest - coord * block, 0), block)


def _indices(lo, hi, block, coord, procs, device):
    i = torch.arange(lo, hi, dtype=torch.int64, device=device)
    return i[torch.div(i, block, rounding_mode="floor") % procs == coord]


def reshard(x, src_rows, grid, block):
    rank, world = dist.get_rank(), dist.get_world_size()
    pr, pc = grid
    br, bc = block
    n_cols = x.shape[1]
    starts = [0]
    for n in src_rows:
        starts.append(starts[-1] + n)

    def coord(d):
        return d % pr, d // pr  # bug: column-major numbering

    def pack(d):
        p, q = coord(d)
        rows = _indices(starts[rank], starts[rank + 1], br, p, pr, x.device) - starts[rank]
        cols = _indices(0, n_cols, bc, q, pc, x.device)
        return x.index_select(0, rows).index_select(1, cols).contiguous()

    def rows_from(s, d):
        p = coord(d)[0]
        return _owned(starts[s], br, p, pr), _owned(starts[s + 1], br, p, pr)

    in_grid = rank < pr * pc
    if not in_grid:
        out = x.new_empty((0, 0))
    else:
        p, q = coord(rank)
        out = x.new_empty((_owned(starts[-1], br, p, pr), _owned(n_cols, bc, q, pc)))
        a, b = rows_from(rank, rank)
        if b > a and out.shape[1]:
            out[a:b] = pack(rank)
    ops = []
    for t in range(1, world):
        dst, frm = (rank + t) % world, (rank - t) % world
        if dst < pr * pc:
            a, b = rows_from(rank, dst)
            if b > a and _owned(n_cols, bc, coord(dst)[1], pc):
                ops.append(dist.P2POp(dist.isend, pack(dst), dst))
        if in_grid and out.shape[1]:
            a, b = rows_from(frm, rank)
            if b > a:
                ops.append(dist.P2POp(dist.irecv, out[a:b], frm))
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    return out
