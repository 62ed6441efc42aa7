"""Golden semantics of the collective-algorithm tasks: a two-level (grouped) all-reduce, an all-to-all-v whose
receivers do not know the counts, and an all-reduce that may be quantised, checked against an error bound."""

from __future__ import annotations

import math

import torch

from . import register
from .base import (CandidateError, GoldenOp, elem_size as _elem, expect_tensor, generator, int_param, int_range, narrow,
                   rand, to_dtype, wide)
from .compare import compare_tensor, first_mismatch

_int_param = int_param


def _float_param(case, key: str, default: float, low: float, high: float) -> float:
    v = case.params.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
        raise ValueError(f"params.{key} must be a number in [{low}, {high}], got {v!r}")
    return float(v)


def _exact(m: dict | None) -> dict | None:
    """A mismatch of a bit-exact comparison, without the tolerance figures (a tolerance of 0 makes them noise)."""
    if m:
        for key in ("rtol", "atol", "worst_tolerance_ratio", "rel_error"):
            m.pop(key, None)
        m.setdefault("detail", "values are moved, not computed: they must match bit for bit")
    return m


def _pair(value, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise CandidateError(f"{what} must return a tuple of two tensors, got {type(value).__name__}")
    return value[0], value[1]


# ----------------------------------------------------------------------------------------------------------------
def groups_of(world: int, group_size: int) -> list[list[int]]:
    """Consecutive groups of `group_size` ranks; the last one holds what is left (world % group_size ranks)."""
    g = max(1, min(group_size, world))
    return [list(range(s, min(s + g, world))) for s in range(0, world, g)]


@register
class TwoLevelAllReduce(GoldenOp):
    """`two_level_all_reduce(x, group_size) -> (group_sum, total)`: ranks form consecutive groups of
    `params.group_size` (the last group is smaller when the size does not divide the world; a size >= world is
    one group). Every rank returns the element-wise sum over the ranks of its own group and the sum over all
    ranks. nccl-tests size: the bytes of x (the all-reduce's)."""

    name = "two_level_all_reduce"
    nccl_op = "all_reduce"
    functions = ("two_level_all_reduce",)

    def validate_case(self, case):
        if len(case.shape) < 1:
            raise ValueError("shape must have at least one dimension")
        if set(case.params) - {"group_size"}:
            raise ValueError(f"unknown params {sorted(set(case.params) - {'group_size'})}; known: group_size")
        _int_param(case, "group_size", low=1)

    def make_inputs(self, case, rank, world, seed):
        return {"x": rand(case.shape, case.dtype, generator(seed), **int_range(case))}

    def call(self, fns, inputs, case, rank, world):
        res = fns["two_level_all_reduce"](inputs["x"], int(case.params["group_size"]))
        g, t = _pair(res, "two_level_all_reduce")
        return {"group_sum": expect_tensor(g, "two_level_all_reduce(...)[0] (group_sum)"),
                "total": expect_tensor(t, "two_level_all_reduce(...)[1] (total)")}

    def expected(self, case, world, inputs):
        xs = [wide(i["x"]) for i in inputs]
        total = narrow(torch.stack(xs).sum(0), case.dtype)
        out: list = [None] * world
        for members in groups_of(world, int(case.params["group_size"])):
            gsum = narrow(torch.stack([xs[m] for m in members]).sum(0), case.dtype)
            for m in members:
                out[m] = {"group_sum": gsum, "total": total}
        return out

    def expected_samples(self, case, world, inputs, pick):
        numel = math.prod(int(s) for s in case.shape)
        flats = [i["x"].reshape(-1) for i in inputs]
        group = {m: members for members in groups_of(world, int(case.params["group_size"])) for m in members}
        out = []
        for r in range(world):
            row = {}
            for name in ("group_sum", "total"):  # sorted name order, as the rank drew its samples
                idx = pick(r, name, numel)
                who = group[r] if name == "group_sum" else range(world)
                row[name] = narrow(torch.stack([wide(flats[m][idx]) for m in who]).sum(0), case.dtype)
            out.append(row)
        return out


# ----------------------------------------------------------------------------------------------------------------
@register
class AllToAllVCounts(GoldenOp):
    """`all_to_all_v(x, send_counts) -> (y, recv_counts)`: rank r sends rows x[o_j : o_j + send_counts[j]] (o_j =
    the sum of the earlier counts) to rank j. y is the concatenation over source ranks s = 0..W-1 of the rows s
    sent to r, in their order; recv_counts[s] = the number of rows rank s sent to r.

    Counts are drawn from each sender's private seed, so a receiver learns them only from the senders. Card cases:
    shape = [m, ...] (m = the mean rows per pair; the row shape is the rest); params: `skew` (the spread of a
    log-normal weight per pair, 0 = uniform in [0, 2m]), `zero_frac` (the share of pairs that send nothing),
    `empty_rank` (that rank, mod world, sends nothing at all), `hot_rank` (that rank, mod world, receives about
    world times the usual rows from everybody). Benchmark cases (`bench`): shape = [rows, ...] is each rank's
    whole x, split over destinations by fixed skewed weights. nccl-tests size: the bytes of one rank's x.
    """

    name = "all_to_all_v_counts"
    nccl_op = "alltoall"
    functions = ("all_to_all_v",)
    KEYS = {"skew", "zero_frac", "empty_rank", "hot_rank", "bench", "row"}

    def validate_case(self, case):
        if len(case.shape) < 1:
            raise ValueError("shape must be [m, ...]: m rows per pair on average, then the row shape")
        unknown = set(case.params) - self.KEYS
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}; known: {sorted(self.KEYS)}")
        _float_param(case, "skew", 0.0, 0.0, 4.0)
        _float_param(case, "zero_frac", 0.0, 0.0, 1.0)
        for key in ("empty_rank", "hot_rank"):
            if key in case.params:
                _int_param(case, key)

    def counts(self, case, rank: int, world: int, g: torch.Generator) -> list[int]:
        m = int(case.shape[0])
        if case.params.get("bench"):
            # each rank's whole x, split over destinations by fixed skewed weights (1, 2, ..., world, rotated)
            w = [1 + (j - rank) % world for j in range(world)]
            tot = sum(w)
            edges = [m * sum(w[:j]) // tot for j in range(world + 1)]
            return [edges[j + 1] - edges[j] for j in range(world)]
        p = case.params
        u = torch.rand(world, generator=g, dtype=torch.float64)
        skew = float(p.get("skew", 0.0))
        w = torch.ones(world, dtype=torch.float64)
        if skew > 0:
            w = torch.exp(skew * torch.randn(world, generator=g, dtype=torch.float64))
        w = w / w.mean()
        c = torch.floor(2 * m * u * w + 0.5)
        zero = torch.rand(world, generator=g, dtype=torch.float64) < float(p.get("zero_frac", 0.0))
        c[zero] = 0
        if "hot_rank" in p:
            hot = int(p["hot_rank"]) % world
            c[hot] = c[hot] * world + m * world
        if "empty_rank" in p and rank == int(p["empty_rank"]) % world:
            c.zero_()
        return [int(v) for v in c.tolist()]

    def make_inputs(self, case, rank, world, seed):
        g = generator(seed)
        counts = self.counts(case, rank, world, g)
        rows = [sum(counts), *case.shape[1:]]
        if case.params.get("bench"):
            rows = [int(case.shape[0]), *case.shape[1:]]
        return {"x": rand(rows, case.dtype, g), "send_counts": torch.tensor(counts, dtype=torch.int64)}

    def call(self, fns, inputs, case, rank, world):
        counts = [int(v) for v in inputs["send_counts"].tolist()]
        res = fns["all_to_all_v"](inputs["x"], counts)
        y, rc = _pair(res, "all_to_all_v")
        y = expect_tensor(y, "all_to_all_v(...)[0] (the received rows)")
        if isinstance(rc, (list, tuple)):
            if not all(type(v) is int for v in rc):
                raise CandidateError("all_to_all_v(...)[1] (recv_counts) must be a list of ints or an int tensor")
            rc = torch.tensor(list(rc), dtype=torch.int64)
        rc = expect_tensor(rc, "all_to_all_v(...)[1] (recv_counts)")
        if rc.is_floating_point() or rc.dtype == torch.bool or rc.dim() != 1:
            raise CandidateError(f"all_to_all_v(...)[1] (recv_counts) must be a 1-D integer tensor or a list of "
                                 f"ints, got {rc.dtype} of shape {list(rc.shape)}")
        return {"y": y, "recv_counts": rc.detach().to(torch.int64)}

    def expected(self, case, world, inputs):
        counts = [[int(v) for v in i["send_counts"].tolist()] for i in inputs]
        offs = [[sum(c[:j]) for j in range(world + 1)] for c in counts]
        out = []
        for r in range(world):
            y = torch.cat([inputs[s]["x"][offs[s][r]:offs[s][r + 1]] for s in range(world)], dim=0)
            out.append({"y": y, "recv_counts": torch.tensor([counts[s][r] for s in range(world)], dtype=torch.int64)})
        return out

    def verify(self, case, world, inputs, outputs, tol):
        # the counts first: a wrong count explains a wrong shape of y better than the shape does
        exp = self.expected(case, world, inputs)
        for r in range(world):
            got = outputs[r].get("recv_counts")
            if got is None:
                return {"case": case.name, "rank": r, "output": "recv_counts", "reason": "missing"}
            m = _exact(compare_tensor(exp[r]["recv_counts"], got, (0.0, 0.0)))
            if m:
                m.update(case=case.name, rank=r, output="recv_counts",
                         detail=f"recv_counts[s] is the number of rows rank s sent to rank {r}")
                return m
        return _exact(first_mismatch(case, exp, outputs, (0.0, 0.0)))  # rows are moved, never computed

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        row = int(perf.params.get("row", 256))
        rows = max(world, size_bytes // (row * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[rows, row], dtype=perf.dtype,
                        params={**perf.params, "bench": True})

    def metric_bytes(self, case, world):
        row = math.prod(int(s) for s in case.shape[1:]) * _elem(case.dtype)
        if case.params.get("bench"):
            return int(case.shape[0]) * row
        return world * int(case.shape[0]) * row  # m rows per pair on average


# ----------------------------------------------------------------------------------------------------------------
#: relative rounding of the output dtype, added to the bound (the exact sum must be stored in it at the end)
OUT_ROUNDING = {torch.float32: 2.0 ** -22, torch.bfloat16: 2.0 ** -8}
BOUND_DIVISOR = 125.0


def _first_bit_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first flat position where two tensors of one shape and dtype differ in their bits, or None."""
    if a.numel() == 0:
        return None
    size = a.element_size()
    ab = a.detach().contiguous().reshape(-1).view(torch.uint8).view(-1, size)
    bb = b.detach().contiguous().reshape(-1).view(torch.uint8).view(-1, size)
    diff = (ab != bb).any(1)
    return int(diff.nonzero()[0]) if bool(diff.any()) else None


def block_bound(xs: list[torch.Tensor], block: int) -> torch.Tensor:
    """Per element of the flattened tensor: the sum over ranks of that rank's largest |x| in the element's block
    of `block` consecutive elements, in float64."""
    n = xs[0].numel()
    nb = -(-n // block) if n else 0
    total = torch.zeros(nb, dtype=torch.float64)
    for x in xs:
        a = x.detach().reshape(-1).to(torch.float64).abs()
        pad = torch.zeros(nb * block, dtype=torch.float64)
        pad[:n] = a
        if nb:
            total += pad.view(nb, block).amax(1)
    return total.repeat_interleave(block)[:n]


@register
class AllReduceBlockBound(GoldenOp):
    """`all_reduce_int8(x, block) -> y`: every rank returns the element-wise sum over ranks of x, to within a
    blockwise bound, and every rank returns the very same values (bit for bit).

    Blocks: `params.block` consecutive elements of the flattened tensor (the last block may be shorter). For an
    element in block b, |y - exact| <= S_b / 125 + u * |exact|, where S_b = the sum over ranks of max |x| over
    block b on that rank and u is the output dtype's rounding (OUT_ROUNDING): what int8 with one scale per block
    gives when each value is quantised at most twice on its way. Inputs: N(0, 1) times a magnitude per block and
    rank, 10**U(-3, 3), a few outliers (x 100), and blocks that are zero on every rank (`params.zero_frac`, drawn
    from the case, not the rank: there the bound is 0 and y must be exactly 0). nccl-tests size: the bytes of x.
    """

    name = "all_reduce_int8_blockwise"
    nccl_op = "all_reduce"
    functions = ("all_reduce_int8",)

    def validate_case(self, case):
        if len(case.shape) < 1:
            raise ValueError("shape must have at least one dimension")
        if to_dtype(case.dtype) not in OUT_ROUNDING:
            raise ValueError(f"dtype must be one of {[str(d).removeprefix('torch.') for d in OUT_ROUNDING]}")
        unknown = set(case.params) - {"block", "zero_frac", "spread"}
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}; known: block, zero_frac, spread")
        b = _int_param(case, "block", low=1)
        if b > 1 << 20:
            raise ValueError("params.block must be at most 2**20")
        _float_param(case, "zero_frac", 0.0, 0.0, 1.0)
        _float_param(case, "spread", 3.0, 0.0, 6.0)

    def make_inputs(self, case, rank, world, seed):
        g = generator(seed)
        n = math.prod(int(s) for s in case.shape)
        block = int(case.params["block"])
        nb = -(-n // block) if n else 0
        x = torch.randn(n, generator=g, dtype=torch.float32)
        spread = float(case.params.get("spread", 3.0))
        mag = torch.pow(10.0, (torch.rand(nb, generator=g, dtype=torch.float32) * 2 - 1) * spread)
        x *= mag.repeat_interleave(block)[:n]
        out = torch.rand(n, generator=g) < 0.002
        x[out] *= 100.0
        zf = float(case.params.get("zero_frac", 0.0))
        if zf > 0 and nb:
            shared = generator(n * 7919 + block * 104729 + 17)  # the same blocks on every rank: from the case
            zero = (torch.rand(nb, generator=shared) < zf).repeat_interleave(block)[:n]
            x[zero] = 0.0
        return {"x": x.to(to_dtype(case.dtype)).reshape([int(s) for s in case.shape])}

    def call(self, fns, inputs, case, rank, world):
        y = fns["all_reduce_int8"](inputs["x"], int(case.params["block"]))
        return {"y": expect_tensor(y, "all_reduce_int8's return value")}

    def expected(self, case, world, inputs):
        total = torch.stack([wide(i["x"]) for i in inputs]).sum(0)
        return [{"y": total} for _ in range(world)]

    def verify(self, case, world, inputs, outputs, tol):
        dt = to_dtype(case.dtype)
        shape = [int(s) for s in case.shape]
        xs = [i["x"] for i in inputs]
        exact = torch.stack([wide(x).reshape(-1) for x in xs]).sum(0)
        bound = block_bound(xs, int(case.params["block"]))
        allowed = bound / BOUND_DIVISOR + OUT_ROUNDING[dt] * exact.abs()
        first = None
        for r in range(world):
            y = outputs[r].get("y")
            if y is None:
                return {"case": case.name, "rank": r, "output": "y", "reason": "missing"}
            if list(y.shape) != shape:
                return {"case": case.name, "rank": r, "output": "y", "reason": "shape", "expected": str(shape),
                        "got": str(list(y.shape)), "detail": "the result has the shape of x"}
            if y.dtype != dt:
                return {"case": case.name, "rank": r, "output": "y", "reason": "dtype", "expected": str(dt),
                        "got": str(y.dtype), "detail": "the result has the dtype of x"}
            g = y.detach().reshape(-1).to(torch.float64)
            err = (g - exact).abs()
            bad = ~(err <= allowed)  # NaN is bad
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                index = [int(v) for v in torch.unravel_index(torch.tensor(i), tuple(shape))] if shape else []
                ratio = err[bad & torch.isfinite(err)] / allowed[bad & torch.isfinite(err)].clamp_min(1e-300)
                return {"case": case.name, "rank": r, "output": "y",
                        "reason": "nan" if bool(torch.isnan(g[i])) else "value", "index": index,
                        "expected": repr(float(exact[i])), "got": repr(float(g[i])),
                        "abs_error": float(err[i]) if bool(torch.isfinite(err[i])) else None,
                        "wrong_count": int(bad.sum()), "total_count": int(exact.numel()),
                        "worst_tolerance_ratio": float(ratio.max()) if ratio.numel() else None,
                        "detail": f"allowed error here is S/{BOUND_DIVISOR:g} + {OUT_ROUNDING[dt]:g}*|exact| = "
                                  f"{float(allowed[i]):.6g}, with S = {float(bound[i]):.6g} the sum over ranks of "
                                  f"their largest |x| in block {i // int(case.params['block'])}"}
            if first is None:
                first = (r, y)
                continue
            i = _first_bit_difference(y, first[1])
            if i is not None:
                a, b = y.detach().reshape(-1), first[1].detach().reshape(-1)
                index = [int(v) for v in torch.unravel_index(torch.tensor(i), tuple(shape))] if shape else []
                return {"case": case.name, "rank": r, "output": "y", "reason": "semantics", "index": index,
                        "expected": repr(float(b[i])), "got": repr(float(a[i])),
                        "detail": f"rank {r} and rank {first[0]} returned different values here; every rank must "
                                  f"return the same result, bit for bit"}
        return None
