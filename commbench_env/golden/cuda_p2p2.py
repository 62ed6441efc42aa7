"""Golden semantics of the second wave of point-to-point CUDA tasks, part 2 (issue #23).

- `halo_exchange_2d_grid`: the halo (ghost-cell) exchange of a 2-D domain cut into tiles over a grid of ranks
  whose column count is a case parameter, corners included, periodic or with a stated fill value outside the
  domain (p2p/halo_exchange_2d_cuda). The torch task's `halo_exchange_2d` fixes the grid by the world size and
  the boundary value at 0, and its benchmark counts only the cells that come from other ranks.
- `peer_gather_rows`: an indexed row gather from a table sharded by rows over the ranks, each rank with its own
  private list of global row ids, -1 meaning a zero row (p2p/peer_gather_indexed: an embedding or KV-page fetch).
"""

from __future__ import annotations

import math

import torch

from . import register
from .base import GoldenOp, bool_param, elem_size as _elem, expect_tensor, generator, int_param, num_param, rand

COPY_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "uint8")


def _check_params(case, allowed: tuple[str, ...]) -> None:
    unknown = set(case.params) - set(allowed)
    if unknown:
        raise ValueError(f"unknown params {sorted(unknown)}; known: {sorted(allowed)}")


def _copy_dtype(case) -> None:
    if case.dtype not in COPY_DTYPES:
        raise ValueError(f"dtype must be one of {COPY_DTYPES}, got {case.dtype!r}")


def _data(shape, dtype: str, gen: torch.Generator) -> torch.Tensor:
    """Random cells: floats N(0, 1); integers from a wide range, so that a cell taken from the wrong place (or a
    fill value where data belongs) almost never matches by chance."""
    if dtype == "uint8":
        return rand(shape, dtype, gen, low=0, high=256)
    if dtype in ("int32", "int64"):
        return rand(shape, dtype, gen, low=-(1 << 20), high=1 << 20)
    return rand(shape, dtype, gen)


# ---- 2-D halo exchange on a grid of ranks ----------------------------------------------------------------------

@register
class HaloExchange2DGrid(GoldenOp):
    """`halo_exchange_2d(x) -> y`: the tile x [H, W] framed by h cells from its (up to) eight neighbours.

    The ranks form a P x Q grid, Q = params.grid_cols (it must divide the world size; `supports_world`),
    P = world / Q; rank r sits at grid row i = r // Q, column j = r % Q and owns rows i*H .. i*H + H - 1 and
    columns j*W .. j*W + W - 1 of the global domain G [P*H, Q*W]. y [H + 2h, W + 2h] is
    y[a, b] = G[i*H - h + a, j*W - h + b], the indices taken modulo G's shape when params.periodic, and
    params.fill (an integer, default 0) where they fall outside G when not; params.width = W (required,
    passed to the kernel). 0 <= h = params.halo <= min(H, W), so
    the frame comes from the eight neighbouring tiles only (in a grid of one row or one column, a periodic rank is
    its own neighbour). A copy: exact, in the dtype of x.

    nccl-tests size: the bytes of the frame's cells that lie inside G (all of them when periodic), averaged over
    the ranks. The benchmark case (`size_case`) is a periodic square tile of side 4h on the squarest grid
    (`grid_2d`), h a multiple of 16 / element size so that every row of the tile and of y starts 16-byte aligned:
    a frame of 20 h^2 cells around an interior of 16 h^2 that y holds too."""

    name = "halo_exchange_2d_grid"
    nccl_op = "sendrecv"
    functions = ("halo_exchange_2d",)
    PARAMS = ("halo", "grid_cols", "periodic", "fill", "width")

    def validate_case(self, case):
        _check_params(case, self.PARAMS)
        _copy_dtype(case)
        if len(case.shape) != 2 or min(case.shape) < 1:
            raise ValueError("shape must be [H, W] (the tile of every rank) with H, W >= 1")
        int_param(case, "halo", None, 0, min(case.shape))
        int_param(case, "grid_cols", None, 1, 8)
        bool_param(case, "periodic", False)
        low = 0 if case.dtype == "uint8" else -100
        int_param(case, "fill", 0, low, 100)
        if int_param(case, "width", None, 1) != case.shape[1]:
            raise ValueError(f"params.width must be W = {case.shape[1]} (the row length of x, passed to the kernel)")

    def supports_world(self, world, case):
        return world % int(case.params["grid_cols"]) == 0

    @staticmethod
    def geometry(case, world: int) -> tuple[int, int, int, int, int, bool, int]:
        """(H, W, h, P, Q, periodic, fill)."""
        hh, ww = (int(s) for s in case.shape)
        q = int(case.params["grid_cols"])
        return (hh, ww, int(case.params["halo"]), world // q, q, bool(case.params.get("periodic", False)),
                int(case.params.get("fill", 0)))

    def sources(self, case, world: int, rank: int, flat: torch.Tensor):
        """For flat positions of rank's y: (source rank, flat position in its x, inside G)."""
        hh, ww, h, p, q, periodic, _ = self.geometry(case, world)
        i, j = divmod(rank, q)
        a, b = flat // (ww + 2 * h), flat % (ww + 2 * h)
        gr, gc = i * hh - h + a, j * ww - h + b
        if periodic:
            gr, gc = gr % (p * hh), gc % (q * ww)
            inside = torch.ones_like(flat, dtype=torch.bool)
        else:
            inside = (gr >= 0) & (gr < p * hh) & (gc >= 0) & (gc < q * ww)
            gr, gc = gr.clamp(0, p * hh - 1), gc.clamp(0, q * ww - 1)
        return (gr // hh) * q + gc // ww, (gr % hh) * ww + gc % ww, inside

    def values(self, case, world: int, tiles: torch.Tensor, rank: int, flat: torch.Tensor) -> torch.Tensor:
        src, pos, inside = self.sources(case, world, rank, flat)
        v = tiles[src, pos]
        v[~inside] = self.geometry(case, world)[6]
        return v

    def make_inputs(self, case, rank, world, seed):
        return {"x": _data(case.shape, case.dtype, generator(seed))}

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["halo_exchange_2d"](inputs["x"]), "halo_exchange_2d's return value")}

    def expected(self, case, world, inputs):
        """Block by block (the benchmark's output specs come from here: no index tensors of y's size): each of the
        nine bands of y is one slice of one tile, since h <= min(H, W)."""
        hh, ww, h, p, q, periodic, fill = self.geometry(case, world)
        row_bands = ((-1, 0, h, hh - h, hh), (0, h, h + hh, 0, hh), (1, h + hh, hh + 2 * h, 0, h))
        col_bands = ((-1, 0, h, ww - h, ww), (0, h, h + ww, 0, ww), (1, h + ww, ww + 2 * h, 0, h))
        out = []
        for r in range(world):
            i, j = divmod(r, q)
            y = torch.full((hh + 2 * h, ww + 2 * h), fill, dtype=inputs[r]["x"].dtype)
            for di, y0, y1, s0, s1 in row_bands:
                for dj, x0, x1, t0, t1 in col_bands:
                    ni, nj = i + di, j + dj
                    if periodic:
                        ni, nj = ni % p, nj % q
                    if y0 == y1 or x0 == x1 or not (0 <= ni < p and 0 <= nj < q):
                        continue  # an empty band, or outside an open domain: the fill stays
                    y[y0:y1, x0:x1] = inputs[ni * q + nj]["x"][s0:s1, t0:t1]
            out.append({"y": y})
        return out

    def expected_samples(self, case, world, inputs, pick):
        hh, ww, h, *_ = self.geometry(case, world)
        tiles = torch.stack([inp["x"].reshape(-1) for inp in inputs])
        numel = (hh + 2 * h) * (ww + 2 * h)
        return [{"y": self.values(case, world, tiles, r, pick(r, "y", numel).to(torch.int64))} for r in range(world)]

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec
        from .p2p_patterns import grid_2d

        esz = _elem(perf.dtype)
        step = 16 // math.gcd(16, esz)  # h * esz a multiple of 16: aligned rows
        h = max(step, math.isqrt(max(1, size_bytes // (20 * esz))) // step * step)
        case = CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[4 * h, 4 * h], dtype=perf.dtype,
                        params={"halo": h, "grid_cols": grid_2d(world)[1], "periodic": True, "fill": 0,
                                "width": 4 * h})
        self.validate_case(case)
        return case

    def metric_bytes(self, case, world):
        hh, ww, h, p, q, periodic, _ = self.geometry(case, world)
        frame = (hh + 2 * h) * (ww + 2 * h) - hh * ww
        if periodic or h == 0:
            return frame * _elem(case.dtype)
        total = 0
        for r in range(world):  # open: the cells of the frame inside G, rank by rank
            i, j = divmod(r, q)
            rows = min((i + 1) * hh + h, p * hh) - max(i * hh - h, 0)
            cols = min((j + 1) * ww + h, q * ww) - max(j * ww - h, 0)
            total += rows * cols - hh * ww
        return total * _elem(case.dtype) // world


# ---- indexed row gather from a sharded table -------------------------------------------------------------------

@register
class PeerGatherRows(GoldenOp):
    """`gather_rows(table, ids) -> y`: rows of a table sharded over the ranks, fetched by global row id.

    Rank s holds `table` [R, d] (the case shape), rows s*R .. s*R + R - 1 of the global table [world*R, d], and
    its own `ids`, int64 [M] (M = params.lookups): global row ids in [0, world*R) or -1. y [M, d] has
    y[m] = global row ids[m], or zeros where ids[m] = -1. The ids are private, drawn from the rank's seed:
    uniform over the global rows (params.skew = 0) or Zipf-skewed over a permutation of them (hot rows, many
    duplicates), every one on rank params.owner's shard when given, each -1 with probability params.pad. A copy:
    exact, in the dtype of the table.

    nccl-tests size: the bytes of y. The benchmark case (`size_case`) gathers rows of perf.params.hidden
    elements with uniform ids, M = the size's rows and R = M (each shard as large as each rank's result)."""

    name = "peer_gather_rows"
    nccl_op = None
    functions = ("gather_rows",)
    PARAMS = ("lookups", "skew", "pad", "owner", "hidden")

    def validate_case(self, case):
        _check_params(case, self.PARAMS)
        _copy_dtype(case)
        if len(case.shape) != 2 or min(case.shape) < 1:
            raise ValueError("shape must be [R, d] (the shard of every rank) with R, d >= 1")
        int_param(case, "lookups", None, 1)
        num_param(case, "skew", 0.0, 0.0, 4.0)
        num_param(case, "pad", 0.0, 0.0, 1.0)
        int_param(case, "owner", None, 0, optional=True)
        if "hidden" in case.params and int_param(case, "hidden", None, 1) != case.shape[1]:
            raise ValueError("params.hidden, where given, must be d (the case's second dimension)")

    def ids(self, case, world: int, gen: torch.Generator) -> torch.Tensor:
        rows, m = int(case.shape[0]), int(case.params["lookups"])
        owner = case.params.get("owner")
        base, n = (int(owner) % world * rows, rows) if owner is not None else (0, world * rows)
        skew = float(case.params.get("skew", 0.0))
        if skew > 0:
            weights = (1.0 + torch.randperm(n, generator=gen).to(torch.float64)) ** (-skew)
            ids = torch.multinomial(weights, m, replacement=True, generator=gen)
        else:
            ids = torch.randint(0, n, (m,), generator=gen)
        ids = ids.to(torch.int64) + base
        pad = float(case.params.get("pad", 0.0))
        if pad > 0:
            ids[torch.rand(m, generator=gen, dtype=torch.float64) < pad] = -1
        return ids

    def make_inputs(self, case, rank, world, seed):
        gen = generator(seed)
        table = _data(case.shape, case.dtype, gen)
        return {"table": table, "ids": self.ids(case, world, gen)}

    def call(self, fns, inputs, case, rank, world):
        y = fns["gather_rows"](inputs["table"], inputs["ids"])
        return {"y": expect_tensor(y, "gather_rows's return value")}

    @staticmethod
    def _global(inputs) -> torch.Tensor:
        return torch.cat([inp["table"] for inp in inputs], dim=0)

    def expected(self, case, world, inputs):
        table = self._global(inputs)
        out = []
        for inp in inputs:
            ids = inp["ids"]
            y = table[ids.clamp_min(0)]
            y[ids < 0] = 0
            out.append({"y": y})
        return out

    def expected_samples(self, case, world, inputs, pick):
        table = self._global(inputs).reshape(-1)
        d = int(case.shape[1])
        out = []
        for r, inp in enumerate(inputs):
            ids = inp["ids"]
            flat = pick(r, "y", ids.numel() * d).to(torch.int64)
            row = ids[flat // d]
            v = table[row.clamp_min(0) * d + flat % d]
            v[row < 0] = 0
            out.append({"y": v})
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        d = int(perf.params.get("hidden", 4096))
        m = max(1, size_bytes // (d * _elem(perf.dtype)))
        case = CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[m, d], dtype=perf.dtype,
                        params={**perf.params, "hidden": d, "lookups": m})
        self.validate_case(case)
        return case

    def metric_bytes(self, case, world):
        return int(case.params["lookups"]) * int(case.shape[1]) * _elem(case.dtype)
