"""Golden semantics of CUDA tasks about synchronisation inside and across kernels: phases of one kernel separated
by grid-wide barriers (a power iteration), and a prefix sum that runs over every rank's data in rank order."""

from __future__ import annotations

import torch

from . import register
from .base import GoldenOp, generator, int_param, num_param, private_length, rand, to_dtype


# ----------------------------------------------------------------------------------------------------------------
@register
class TridiagPowerIteration(GoldenOp):
    """`power_iteration(x, lower, diag, upper) -> y`: `rounds` steps of a power iteration with the tridiagonal
    matrix A whose row i is (lower[i], diag[i], upper[i]) around the diagonal, normalised by the largest magnitude.

    Every rank works on its own data (n values): y_0 = x; for k = 0 .. rounds-1:
        w[i] = lower[i] * y_k[i-1] + diag[i] * y_k[i] + upper[i] * y_k[i+1]   (y_k[-1] = y_k[n] = 0)
        m_k = max_i |w[i]|;  y_{k+1} = w / m_k
    and `y` = y_rounds. lower[0] and upper[n-1] hold values that must be ignored (the matrix has no such entries).
    Computed in float64 here; float32 candidates are compared with the card's tolerance.

    Card cases: shape [n], dtype float32 or float64; params: `rounds` (1 .. 65535), `spread` (the disorder of the
    matrix: diag in 2 +- spread, lower/upper in 0.5 +- spread/2, x in [0.5, 1.5); default 0.1, which keeps every
    component of y within a few orders of magnitude of the largest after 64 rounds), `signed` (x, lower and upper
    uniform in (-1, 1), diag of random sign with magnitude in [0.5, 2): m_k then comes from either sign).

    Benchmark: shape [bytes / element size], `rounds` from the card's performance params. Size: one rank's x.
    """

    name = "tridiag_power_iteration"
    nccl_op = None
    functions = ("power_iteration",)
    KNOWN = {"rounds", "spread", "signed"}
    MAX_ROUNDS = 65535

    def validate_case(self, case):
        if case.dtype not in ("float32", "float64"):
            raise ValueError("dtype must be float32 or float64")
        if len(case.shape) != 1 or case.shape[0] < 1:
            raise ValueError("shape must be [n] with n >= 1")
        unknown = set(case.params) - self.KNOWN
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}; known: {sorted(self.KNOWN)}")
        int_param(case, "rounds", 1, 1, self.MAX_ROUNDS)
        num_param(case, "spread", 0.1, 0.0, 1.0)
        if not isinstance(case.params.get("signed", False), bool):
            raise ValueError("params.signed must be true or false")

    def make_inputs(self, case, rank, world, seed):
        g = generator(seed)
        n = int(case.shape[0])
        dt = to_dtype(case.dtype)

        def u(lo: float, hi: float) -> torch.Tensor:
            return torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo

        if case.params.get("signed"):
            x, lower, upper = u(-1, 1), u(-1, 1), u(-1, 1)
            sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
            diag = u(0.5, 2.0) * sign
        else:
            s = float(case.params.get("spread", 0.1))
            x = u(0.5, 1.5)
            lower, upper, diag = u(0.5 - s / 2, 0.5 + s / 2), u(0.5 - s / 2, 0.5 + s / 2), u(2 - s, 2 + s)
        # lower[0] and upper[n-1] are not part of the matrix: keep them large, so that using them shows
        lower[0] = 3.0
        upper[n - 1] = -3.0
        return {"x": x.to(dt), "lower": lower.to(dt), "diag": diag.to(dt), "upper": upper.to(dt)}

    def call(self, fns, inputs, case, rank, world):
        raise NotImplementedError("tridiag_power_iteration is a cuda task: the device host calls the kernel")

    @staticmethod
    def iterate(x: torch.Tensor, lower: torch.Tensor, diag: torch.Tensor, upper: torch.Tensor,
                rounds: int) -> torch.Tensor:
        """The iteration in float64."""
        y = x.to(torch.float64)
        lo, di, up = (t.to(torch.float64) for t in (lower, diag, upper))
        for _ in range(rounds):
            w = di * y
            w[1:] += lo[1:] * y[:-1]
            w[:-1] += up[:-1] * y[1:]
            m = w.abs().max()
            if not bool(m > 0):
                raise ValueError("max |w| is 0: the case's inputs leave the iteration undefined")
            y = w / m
        return y

    def expected(self, case, world, inputs):
        rounds = int(case.params.get("rounds", 1))
        return [{"y": self.iterate(i["x"], i["lower"], i["diag"], i["upper"], rounds)} for i in inputs]

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        elem = torch.empty((), dtype=to_dtype(perf.dtype)).element_size()
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[max(1, size_bytes // elem)],
                        dtype=perf.dtype, params=dict(perf.params))


# ----------------------------------------------------------------------------------------------------------------
@register
class RankMajorExclusiveScan(GoldenOp):
    """`scan(x) -> y`: the exclusive prefix sum over the concatenation of every rank's x in rank order.

    Rank r holds x_r, n_r integers (int32 or int64); y_r[i] = (sum of every x_q, q < r) + x_r[0] + ... + x_r[i-1],
    in the dtype of x (y_0[0] = 0). Exact integer arithmetic: int32 cases keep every prefix sum within int32,
    int64 cases use values far beyond 2^32 in total.

    Card cases: shape [n]; values uniform in int_range (default [0, 16): counts); params: `uneven` (each rank
    draws n_r in [0, n]), `empty_rank` (that rank mod world holds none).

    Benchmark: shape [bytes / element size] on every rank. Size: one rank's x.
    """

    name = "rank_major_exclusive_scan"
    nccl_op = None
    functions = ("scan",)
    KNOWN = {"uneven", "empty_rank"}
    DEFAULT_RANGE = (0, 16)

    def validate_case(self, case):
        if case.dtype not in ("int32", "int64"):
            raise ValueError("dtype must be int32 or int64")
        if len(case.shape) != 1 or case.shape[0] < 0:
            raise ValueError("shape must be [n] with n >= 0")
        unknown = set(case.params) - self.KNOWN
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}; known: {sorted(self.KNOWN)}")
        if not isinstance(case.params.get("uneven", False), bool):
            raise ValueError("params.uneven must be true or false")
        if "empty_rank" in case.params:
            int_param(case, "empty_rank", low=0)
        lo, hi = case.int_range or self.DEFAULT_RANGE
        # every prefix sum of the largest world (8 ranks) must fit in the dtype
        worst = 8 * int(case.shape[0]) * max(abs(lo), abs(hi - 1))
        bits = 31 if case.dtype == "int32" else 63
        if worst >= 2 ** bits:
            raise ValueError(f"{case.dtype} sums could overflow: 8 ranks x {case.shape[0]} values in [{lo}, {hi})")

    def make_inputs(self, case, rank, world, seed):
        g = generator(seed)
        n = private_length(case, rank, world, g)
        lo, hi = case.int_range or self.DEFAULT_RANGE
        return {"x": rand((n,), case.dtype, g, low=lo, high=hi)}

    def call(self, fns, inputs, case, rank, world):
        raise NotImplementedError("rank_major_exclusive_scan is a cuda task: the device host calls the kernel")

    def expected(self, case, world, inputs):
        offset = 0
        outs = []
        for i in inputs:
            x = i["x"].to(torch.int64)
            incl = torch.cumsum(x, 0) if x.numel() else x
            outs.append({"y": (incl - x + offset).to(i["x"].dtype)})
            offset += int(x.sum())
        return outs

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        elem = torch.empty((), dtype=to_dtype(perf.dtype)).element_size()
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[max(1, size_bytes // elem)],
                        dtype=perf.dtype, params=dict(perf.params))
