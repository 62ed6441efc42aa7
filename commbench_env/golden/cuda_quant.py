"""Golden semantics of quantised CUDA collectives: an all-reduce whose result may carry fp8 (e4m3) rounding."""

from __future__ import annotations

import math

import torch

from . import register
from .base import generator, int_param, num_param, to_dtype, wide
from .collective_algorithms import AllReduceBlockBound, block_bound

# |y - exact| <= (A + |exact|) / REL_DIVISOR + S_b / FLOOR_DIVISOR + u * |exact|  (see AllReduceFp8Blockwise)
REL_DIVISOR = 14.0
FLOOR_DIVISOR = 65536.0
OUT_ROUNDING = {torch.float32: 2.0 ** -22, torch.bfloat16: 2.0 ** -8}
BLOCK_RANGE = (16, 1024)


@register
class AllReduceFp8Blockwise(AllReduceBlockBound):
    """`all_reduce` (sum) whose result may be as inexact as fp8 e4m3 with one scale per block allows, and is the
    same, bit for bit, on every rank.

    For element e of block b (params.block consecutive elements of the flattened tensor, the last block may be
    shorter): |y[e] - exact[e]| <= (A[e] + |exact[e]|) / 14 + S_b / 65536 + u |exact[e]|, with A[e] = sum over ranks
    of |x_p[e]|, S_b = sum over ranks of max |x_p| over block b, u the rounding of the output dtype (2^-22 float32,
    2^-8 bfloat16). e4m3 rounds to 3 mantissa bits (relative error <= 2^-4), and with a scale that maps a block's
    largest |value| to 448 its subnormals round to within amax * 2^-10 / 448: a value rounded once where it starts
    (on its rank) and once more after the sum (on the rank that reduces it) stays within the bound with some
    margin; rounding at every hop of a ring, one scale for the whole tensor, or 2-bit mantissas (e5m2) do not.
    A block that is zero on every rank must come out exactly 0; NaN or inf fails.

    Inputs (as AllReduceBlockBound): N(0, 1) times a magnitude 10**U(-spread, spread) per block and rank, a share
    `outliers` of values times 100, and a share zero_frac of blocks that are zero on every rank. Benchmark sizes use
    spread 0, no outliers and no zero blocks (plain N(0, 1)), where the card's tolerance (a gross-error test:
    missing or stale contributions, NaN) checks the sampled outputs of timed calls. nccl-tests size: the bytes of
    x in its own dtype (the logical bytes, whatever crosses the links).
    """

    name = "all_reduce_fp8_blockwise"
    nccl_op = "all_reduce"
    functions = ("all_reduce",)
    KNOWN = {"block", "zero_frac", "spread", "outliers"}

    def validate_case(self, case):
        if len(case.shape) < 1 or math.prod(case.shape) < 1:
            raise ValueError("shape must have at least one dimension and at least one element")
        if to_dtype(case.dtype) not in OUT_ROUNDING:
            raise ValueError(f"dtype must be one of {[str(d).removeprefix('torch.') for d in OUT_ROUNDING]}")
        unknown = set(case.params) - self.KNOWN
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}; known: {sorted(self.KNOWN)}")
        int_param(case, "block", low=BLOCK_RANGE[0], high=BLOCK_RANGE[1])
        num_param(case, "zero_frac", 0.0, 0.0, 1.0)
        num_param(case, "spread", 3.0, 0.0, 6.0)
        num_param(case, "outliers", 0.002, 0.0, 1.0)

    def make_inputs(self, case, rank, world, seed):
        g = generator(seed)
        n = math.prod(int(s) for s in case.shape)
        block = int(case.params["block"])
        nb = -(-n // block)
        spread = float(case.params.get("spread", 3.0))
        outliers = float(case.params.get("outliers", 0.002))
        zf = float(case.params.get("zero_frac", 0.0))
        if spread == 0 and outliers == 0 and zf == 0:  # the benchmark's plain N(0, 1), chunked for large sizes
            from .base import rand

            return {"x": rand([int(s) for s in case.shape], case.dtype, g)}
        x = torch.randn(n, generator=g, dtype=torch.float32)
        mag = torch.pow(10.0, (torch.rand(nb, generator=g, dtype=torch.float32) * 2 - 1) * spread)
        x *= mag.repeat_interleave(block)[:n]
        if outliers > 0:
            x[torch.rand(n, generator=g) < outliers] *= 100.0
        if zf > 0:
            shared = generator(n * 7919 + block * 104729 + 17)  # the same blocks on every rank: from the case
            x[(torch.rand(nb, generator=shared) < zf).repeat_interleave(block)[:n]] = 0.0
        return {"x": x.to(to_dtype(case.dtype)).reshape([int(s) for s in case.shape])}

    def call(self, fns, inputs, case, rank, world):
        raise NotImplementedError("all_reduce_fp8_blockwise is a cuda task: the device host calls the kernel")

    def expected(self, case, world, inputs):
        """The exact sum (float64), accumulated rank by rank (no stack of every rank's input at benchmark sizes)."""
        total = wide(inputs[0]["x"]).clone()
        for i in inputs[1:]:
            total += wide(i["x"])
        return [{"y": total} for _ in range(world)]

    def allowed_error(self, case, inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(exact, allowed error, S) per element of the flattened tensor, in float64."""
        xs = [i["x"] for i in inputs]
        flat = torch.stack([wide(x).reshape(-1) for x in xs])
        exact = flat.sum(0)
        a = flat.abs().sum(0)
        s = block_bound(xs, int(case.params["block"]))
        u = OUT_ROUNDING[to_dtype(case.dtype)]
        return exact, (a + exact.abs()) / REL_DIVISOR + s / FLOOR_DIVISOR + u * exact.abs(), s

    def verify(self, case, world, inputs, outputs, tol):
        dt = to_dtype(case.dtype)
        shape = [int(s) for s in case.shape]
        exact, allowed, s = self.allowed_error(case, inputs)
        first = None
        for r in range(world):
            y = outputs[r].get("y")
            base = {"case": case.name, "rank": r, "output": "y"}
            if y is None:
                return {**base, "reason": "missing"}
            if list(y.shape) != shape or y.dtype != dt:
                return {**base, "reason": "shape", "expected": f"{str(dt).removeprefix('torch.')} {shape}",
                        "got": f"{str(y.dtype).removeprefix('torch.')} {list(y.shape)}"}
            g = y.detach().reshape(-1).to(torch.float64)
            err = (g - exact).abs()
            bad = ~(err <= allowed)  # NaN is bad
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                index = [int(v) for v in torch.unravel_index(torch.tensor(i), tuple(shape))]
                fin = bad & torch.isfinite(err)
                ratio = err[fin] / allowed[fin].clamp_min(1e-300)
                block = int(case.params["block"])
                return {**base, "reason": "nan" if bool(torch.isnan(g[i])) else "value", "index": index,
                        "expected": repr(float(exact[i])), "got": repr(float(g[i])),
                        "abs_error": float(err[i]) if bool(torch.isfinite(err[i])) else None,
                        "wrong_count": int(bad.sum()), "total_count": int(exact.numel()),
                        "worst_tolerance_ratio": float(ratio.max()) if ratio.numel() else None,
                        "detail": f"allowed error here is (A + |exact|)/{REL_DIVISOR:g} + S/{FLOOR_DIVISOR:g} + "
                                  f"{OUT_ROUNDING[dt]:g}*|exact| = {float(allowed[i]):.6g}, with A the sum over "
                                  f"ranks of |x| at this element and S = {float(s[i]):.6g} the sum over ranks of "
                                  f"their largest |x| in block {i // block}"}
            if first is None:
                first = (r, y)
                continue
            a, b = y.detach().reshape(-1), first[1].detach().reshape(-1)
            diff = (a.view(torch.int16) if dt == torch.bfloat16 else a.view(torch.int32)) != \
                   (b.view(torch.int16) if dt == torch.bfloat16 else b.view(torch.int32))
            if bool(diff.any()):
                i = int(diff.nonzero()[0])
                index = [int(v) for v in torch.unravel_index(torch.tensor(i), tuple(shape))]
                return {**base, "reason": "semantics", "index": index, "expected": repr(float(b[i])),
                        "got": repr(float(a[i])), "wrong_count": int(diff.sum()), "total_count": int(a.numel()),
                        "detail": f"rank {r} and rank {first[0]} returned different values here; every rank must "
                                  f"return the same result, bit for bit"}
        return None

    def expected_samples(self, case, world, inputs, pick):
        """The exact sums at the picked positions (float64), without the block bounds."""
        flat = [wide(i["x"]).reshape(-1) for i in inputs]
        n = flat[0].numel()
        out = []
        for r in range(world):
            idx = pick(r, "y", n)
            out.append({"y": sum(f[idx] for f in flat)})
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        elem = torch.empty((), dtype=to_dtype(perf.dtype)).element_size()
        params = {"block": 128, **perf.params, "spread": 0.0, "outliers": 0.0, "zero_frac": 0.0}
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[max(1, size_bytes // elem)],
                        dtype=perf.dtype, params=params)
