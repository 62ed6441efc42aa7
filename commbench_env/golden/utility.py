"""Utilities around communication: a barrier, bucketed gradient averaging, and an all-gather of uneven lengths."""

from __future__ import annotations

import functools
import math
import time

import torch
import torch.distributed as dist

from . import register
from .base import (CandidateError, GoldenOp, expect_tensor, generator, int_param, narrow, private_length, rand,
                   to_dtype, wide)

from .collectives import AllGatherCat

_int_param = int_param

# Captured when the judge imports the golden ops, i.e. before the rank installs its tripwires. A forbidden
# `all_reduce` replaces both `torch.distributed.all_reduce` and the ProcessGroup method `allreduce` that it calls,
# so capturing `torch.distributed.all_reduce` alone would not do: the harness calls the unbound method directly.
# The backend's own all-reduce, bound at import (before any rank guards its collectives, judge/candidate/dispatch_guard.py):
# the harness's all_reduce handed to candidates is the one route to a reduction in tasks that forbid the rest.
_BACKEND_ALLREDUCE = torch._C._distributed_c10d.Backend.allreduce if dist.is_available() else None
_ALLREDUCE_OPTIONS = dist.AllreduceOptions if dist.is_available() else None
_SUM = dist.ReduceOp.SUM if dist.is_available() else None
_CLOCK = time.monotonic_ns  # CLOCK_MONOTONIC is one clock for every process of the host: ranks compare stamps
_SLEEP = time.sleep

PICKS = 256  # elements of the output a timed iteration sends back for checking


# ----------------------------------------------------------------------------------------------------------------
@register
class Barrier(GoldenOp):
    """`barrier()`: no rank returns before every rank has called it. Called `shape[0]` times in a row per case.

    Each rank sleeps a secret delay before each call (one rank per call is far later than the rest), stamps the
    monotonic clock just before and just after the call, and the coordinator checks, call by call, that every
    rank's exit stamp is not earlier than the latest entry stamp.
    """

    name = "barrier"
    nccl_op = None
    functions = ("barrier",)
    MAX_ROUNDS = 32

    def validate_case(self, case):
        if len(case.shape) != 1 or not 1 <= case.shape[0] <= self.MAX_ROUNDS:
            raise ValueError(f"shape must be [rounds] with 1 <= rounds <= {self.MAX_ROUNDS}")
        _int_param(case, "shift", 0)
        for key in ("late_ms", "early_ms"):
            v = case.params.get(key)
            ok = isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v)
            if v is not None and not (ok and 0 <= v[0] <= v[1] <= 200):
                raise ValueError(f"params.{key} must be [low, high] milliseconds with 0 <= low <= high <= 200")

    def late_rank(self, case, world: int, k: int) -> int:
        """The rank that arrives last at call k: the last rank first, then downwards, so rank 0 is late too."""
        return (int(case.params.get("shift", 0)) - 1 - k) % world

    def make_inputs(self, case, rank, world, seed):
        rounds = case.shape[0]
        if case.params.get("bench"):
            return {"secret_delay_ns": torch.zeros(rounds, dtype=torch.int64)}
        late_lo, late_hi = case.params.get("late_ms", [12, 24])
        early_lo, early_hi = case.params.get("early_ms", [0, 2])
        u = torch.rand(rounds, generator=generator(seed), dtype=torch.float64).tolist()
        delays = []
        for k in range(rounds):
            lo, hi = (late_lo, late_hi) if rank == self.late_rank(case, world, k) else (early_lo, early_hi)
            delays.append(int((lo + (hi - lo) * u[k]) * 1e6))
        return {"secret_delay_ns": torch.tensor(delays, dtype=torch.int64)}

    def call(self, fns, inputs, case, rank, world):
        fn = fns["barrier"]
        delays = inputs["secret_delay_ns"].tolist()
        enter = [0] * len(delays)
        leave = [0] * len(delays)
        for k, d in enumerate(delays):
            if d > 0:
                _SLEEP(d / 1e9)
            enter[k] = _CLOCK()
            fn()
            leave[k] = _CLOCK()
        return {"enter": torch.tensor(enter, dtype=torch.int64), "exit": torch.tensor(leave, dtype=torch.int64)}

    def expected(self, case, world, inputs):
        raise NotImplementedError("barrier is checked by verify(): there is no single expected output")

    def verify(self, case, world, inputs, outputs, tol):
        rounds = case.shape[0]
        for r in range(world):
            for name in ("enter", "exit"):
                t = outputs[r].get(name)
                if t is None or tuple(t.shape) != (rounds,):
                    return {"case": case.name, "rank": r, "output": name, "reason": "missing",
                            "detail": f"rank {r} did not report {rounds} {name} times"}
        for k in range(rounds):
            enters = [int(outputs[r]["enter"][k]) for r in range(world)]
            last = max(range(world), key=lambda r: enters[r])
            for r in range(world):
                left = int(outputs[r]["exit"][k])
                if left < enters[last]:
                    early = (enters[last] - left) / 1e6
                    return {"case": case.name, "rank": r, "output": "exit", "reason": "semantics", "index": [k],
                            "expected": f"return after rank {last} called barrier()",
                            "got": f"returned {early:.3f} ms before rank {last} called barrier()",
                            "detail": f"call {k + 1} of {rounds} in a row: rank {r} returned from barrier() "
                                      f"{early:.3f} ms before rank {last} entered it; no rank may return "
                                      f"before every rank has called barrier()"}
        return None

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        return CaseSpec(name="bench-latency", visible=False, shape=[1], dtype=perf.dtype,
                        params={**perf.params, "bench": True})

    def metric_bytes(self, case, world):
        return 0


# ----------------------------------------------------------------------------------------------------------------
def _counting_all_reduce(group):
    """The all_reduce handed to the candidate: an in-place sum over ranks that counts calls and bytes.

    A closure, not an object, so the candidate has no attribute through which to reset the counts."""
    stats = [0, 0, 0]  # calls, largest call in bytes, bytes in all calls
    fabric_allreduce = getattr(group, "harness_allreduce", None)

    def all_reduce(t) -> None:
        t = expect_tensor(t, "the argument of all_reduce")
        if not t.is_contiguous():
            raise CandidateError("all_reduce needs a contiguous tensor (a flat bucket or a contiguous view of one)")
        nbytes = t.numel() * t.element_size()
        stats[0] += 1
        stats[1] = max(stats[1], nbytes)
        stats[2] += nbytes
        opts = _ALLREDUCE_OPTIONS()
        opts.reduceOp = _SUM
        if fabric_allreduce is not None:  # CPU: the coordinator's fabric (judge/candidate/fabric_group.py)
            fabric_allreduce(t).wait()
            return
        _BACKEND_ALLREDUCE(group._get_backend(t.device), [t], opts).wait()

    return all_reduce, stats


def _gather_flat(tensors, picks: list[int]) -> torch.Tensor:
    """Elements at sorted positions `picks` of the tensors flattened and concatenated in order, as float64."""
    got, start, j = [], 0, 0
    for t in tensors:
        end = start + t.numel()
        k = j
        while k < len(picks) and picks[k] < end:
            k += 1
        if k > j:
            got.append(t.detach().reshape(-1)[torch.tensor(picks[j:k]) - start].to(torch.float64))
        j, start = k, end
    return torch.cat(got) if got else torch.zeros(0, dtype=torch.float64)


@functools.lru_cache(maxsize=64)
def _grad_layout(shape: tuple[int, ...], layout_seed: int, bench: bool) -> tuple[tuple[int, ...], ...]:
    if bench:  # four weight matrices (flattened) with small biases, like a stack of linear layers
        count = shape[0]
        bias = max(1, count // 1024)
        w = (count - 4 * bias) // 4
        last = count - 3 * (w + bias) - bias
        return ((w,), (bias,), (w,), (bias,), (w,), (bias,), (last,), (bias,))
    n, maxd = shape
    g = generator(layout_seed * 1_000_003 + 17)
    ndims = (1, 2, 2, 1, 2, 3, 1, 0)  # mostly vectors and matrices, some 3-D, now and then a 0-D scalar
    shapes = []
    for _ in range(n):
        nd = ndims[int(torch.randint(0, len(ndims), (1,), generator=g))]
        hi = maxd if nd < 3 else max(1, maxd // 4)
        shapes.append(tuple(int(d) for d in torch.randint(1, hi + 1, (nd,), generator=g)))
    return tuple(shapes)


@register
class BucketedGradAverage(GoldenOp):
    harness_collectives = frozenset({"allreduce"})
    """`average_gradients(grads, bucket_bytes, all_reduce) -> list`: the mean over ranks of every gradient, with
    at most ceil(total_bytes / bucket_bytes) calls of the harness's `all_reduce`, none larger than bucket_bytes.

    Card cases: shape = [n_tensors, max_dim]; params.layout_seed picks the tensor shapes (the same on every rank),
    params.bucket_bytes the bucket size. Benchmark cases: shape = [total elements], split into a fixed layout.
    """

    name = "bucketed_grad_average"
    nccl_op = "all_reduce"
    functions = ("average_gradients",)

    def validate_case(self, case):
        if len(case.shape) != 2 or not 1 <= case.shape[0] <= 64 or not 1 <= case.shape[1] <= 4096:
            raise ValueError("shape must be [n_tensors, max_dim] with 1 <= n_tensors <= 64 and 1 <= max_dim <= 4096")
        if case.dtype not in ("float32", "float64"):
            raise ValueError("dtype must be float32 or float64")
        _int_param(case, "layout_seed", 0)
        b = _int_param(case, "bucket_bytes")
        if b < 8 or b % 8:
            raise ValueError("params.bucket_bytes must be a positive multiple of 8")

    def layout(self, case) -> list[tuple[int, ...]]:
        """The gradient shapes of a case: a function of shape and params alone, so the same on every rank."""
        p = case.params
        return list(_grad_layout(tuple(case.shape), int(p.get("layout_seed", 0)), bool(p.get("bench"))))

    def total_bytes(self, case) -> int:
        elem = torch.empty((), dtype=to_dtype(case.dtype)).element_size()
        return sum(math.prod(s) for s in self.layout(case)) * elem

    def buckets(self, case) -> int:
        return -(-self.total_bytes(case) // int(case.params["bucket_bytes"]))

    def make_inputs(self, case, rank, world, seed):
        g = generator(seed)
        shapes = self.layout(case)
        out = {f"g{i}": rand(s, case.dtype, g) for i, s in enumerate(shapes)}
        if case.params.get("bench"):
            total = sum(math.prod(s) for s in shapes)
            out["secret_pick"] = torch.randint(0, total, (PICKS,), generator=g).sort().values
        return out

    def call(self, fns, inputs, case, rank, world):
        n = len(self.layout(case))
        grads = [inputs[f"g{i}"] for i in range(n)]
        reduce_fn, stats = _counting_all_reduce(dist.group.WORLD)
        res = fns["average_gradients"](grads, int(case.params["bucket_bytes"]), reduce_fn)
        if not isinstance(res, (list, tuple)):
            raise CandidateError(f"average_gradients must return a list of tensors, got {type(res).__name__}")
        if len(res) != n:
            raise CandidateError(f"average_gradients returned {len(res)} tensors for {n} gradients")
        outs = [expect_tensor(t, f"average_gradients(...)[{i}]") for i, t in enumerate(res)]
        result = {"calls": torch.tensor(stats, dtype=torch.int64)}
        if not case.params.get("bench"):
            result.update({f"g{i}": t for i, t in enumerate(outs)})
            return result
        # timed iterations send back a few secretly chosen elements, not the whole model
        for i, (t, g) in enumerate(zip(outs, grads)):
            if t.shape != g.shape or t.dtype != g.dtype:
                raise CandidateError(f"average_gradients(...)[{i}] is {t.dtype} {list(t.shape)}, "
                                     f"expected {g.dtype} {list(g.shape)}")
        result["pick"] = _gather_flat(outs, inputs["secret_pick"].tolist())
        return result

    def expected(self, case, world, inputs):
        n = len(self.layout(case))
        means = {f"g{i}": narrow(torch.stack([wide(x[f"g{i}"]) for x in inputs]).sum(0) / world, case.dtype)
                 for i in range(n)}
        return [dict(means) for _ in range(world)]

    def verify(self, case, world, inputs, outputs, tol):
        from .compare import compare_tensor, first_mismatch

        bucket = int(case.params["bucket_bytes"])
        total = self.total_bytes(case)
        budget = -(-total // bucket)
        for r in range(world):
            c = outputs[r].get("calls")
            if c is None or c.numel() != 3:
                return {"case": case.name, "rank": r, "output": "calls", "reason": "missing",
                        "detail": f"rank {r} reported no all_reduce statistics"}
            calls, biggest = int(c[0]), int(c[1])
            if biggest > bucket:
                return {"case": case.name, "rank": r, "output": "all_reduce", "reason": "semantics",
                        "expected": f"<= {bucket} bytes per all_reduce call", "got": f"{biggest} bytes",
                        "detail": f"rank {r} passed a {biggest}-byte tensor to all_reduce; "
                                  f"no call may carry more than bucket_bytes = {bucket}"}
            if calls > budget:
                return {"case": case.name, "rank": r, "output": "all_reduce", "reason": "semantics",
                        "expected": f"<= {budget} all_reduce calls", "got": f"{calls} calls",
                        "detail": f"rank {r} called all_reduce {calls} times; {total} bytes of gradients in "
                                  f"buckets of {bucket} bytes allow at most ceil({total}/{bucket}) = {budget} calls"}
        dt = to_dtype(case.dtype)
        if case.params.get("bench"):
            n = len(self.layout(case))
            for r in range(world):
                got = outputs[r].get("pick")
                picks = inputs[r]["secret_pick"].tolist()
                exp = sum(_gather_flat([x[f"g{i}"] for i in range(n)], picks) for x in inputs) / world
                if got is None:
                    return {"case": case.name, "rank": r, "output": "pick", "reason": "missing"}
                m = compare_tensor(exp, got, tol)
                if m:
                    m.pop("wrong_count", None), m.pop("total_count", None)
                    if m.get("index"):
                        m["index"] = [int(inputs[r]["secret_pick"][m["index"][0]])]
                    m.update(case=case.name, rank=r, output="gradients (flattened in list order)",
                             detail="sampled check of the averaged gradients")
                    return m
            return None
        for r in range(world):
            for name, t in outputs[r].items():
                if name.startswith("g") and isinstance(t, torch.Tensor) and t.dtype != dt:
                    return {"case": case.name, "rank": r, "output": name, "reason": "dtype",
                            "expected": str(dt), "got": str(t.dtype),
                            "detail": "each averaged gradient must keep its gradient's dtype"}
        return first_mismatch(case, self.expected(case, world, inputs), outputs, tol)

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        elem = torch.empty((), dtype=to_dtype(perf.dtype)).element_size()
        count = max(16, size_bytes // elem)
        params = {"bucket_bytes": 262144, **perf.params, "bench": True}
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[count], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        return self.total_bytes(case)


# ----------------------------------------------------------------------------------------------------------------
@register
class AllGatherVarlen(GoldenOp):
    """`all_gather_varlen(x) -> y`: every rank returns the concatenation, in rank order, of all ranks' 1-D x.

    Card cases: shape = [max_len]; each rank's length is drawn from its own seed in [0, max_len], and the rank
    params.empty_rank (mod world), if given, has length 0. Benchmark cases: shape = [total], split unevenly
    (rank r holds a share proportional to r + 1).
    """

    name = "all_gather_varlen"
    nccl_op = "all_gather"
    functions = ("all_gather_varlen",)

    def validate_case(self, case):
        if len(case.shape) != 1 or case.shape[0] < 0:
            raise ValueError("shape must be [max_len] with max_len >= 0")
        if "empty_rank" in case.params:
            _int_param(case, "empty_rank")

    def length(self, case, rank, world, g) -> int:
        n = case.shape[0]
        if case.params.get("bench"):
            tri = world * (world + 1) // 2
            return n * (rank + 1) * (rank + 2) // 2 // tri - n * rank * (rank + 1) // 2 // tri
        if "empty_rank" in case.params and rank == int(case.params["empty_rank"]) % world:
            return 0
        return int(torch.randint(0, n + 1, (1,), generator=g))

    def make_inputs(self, case, rank, world, seed):
        g = generator(seed)
        return {"x": rand([self.length(case, rank, world, g)], case.dtype, g)}

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["all_gather_varlen"](inputs["x"]), "all_gather_varlen's return value")}

    def expected(self, case, world, inputs):
        y = narrow(torch.cat([wide(i["x"]) for i in inputs]), case.dtype)
        return [{"y": y} for _ in range(world)]

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        elem = torch.empty((), dtype=to_dtype(perf.dtype)).element_size()
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[max(world, size_bytes // elem)],
                        dtype=perf.dtype, params={**perf.params, "bench": True})

    def metric_bytes(self, case, world):
        elem = torch.empty((), dtype=to_dtype(case.dtype)).element_size()
        if case.params.get("bench"):
            return case.shape[0] * elem
        return world * case.shape[0] * elem // 2  # lengths are uniform in [0, max_len]


# ----------------------------------------------------------------------------------------------------------------
@register
class PeerHistogram(GoldenOp):
    """`histogram(ids, bins) -> y`: a histogram whose bins are spread over the ranks; rank r returns the counts of
    global bins r*bins .. (r+1)*bins - 1 over the ids of ALL ranks.

    Each rank holds int32 ids in [0, world * bins). Card cases: shape = [n] ids per rank (params.uneven: each
    rank draws its own length in [0, n], and rank params.empty_rank mod world, if given, has none);
    params.bins = bins per rank; params.hot = the fraction of ids that fall on a few hot bins shared by every rank
    (contention on the same counters). Counts are integers, so the result is exact whatever the order of the
    additions. nccl-tests size: the bytes of one rank's ids.
    """

    name = "peer_histogram"
    nccl_op = None
    functions = ("histogram",)
    HOT_BINS = 4

    def validate_case(self, case):
        if case.dtype != "int32":
            raise ValueError("dtype must be int32 (the ids)")
        if len(case.shape) != 1 or case.shape[0] < 0:
            raise ValueError("shape must be [n] with n >= 0 ids per rank")
        b = _int_param(case, "bins")
        if not 1 <= b <= 1 << 20:
            raise ValueError(f"params.bins must be in [1, {1 << 20}], got {b}")
        hot = case.params.get("hot", 0.0)
        if isinstance(hot, bool) or not isinstance(hot, (int, float)) or not 0.0 <= hot <= 1.0:
            raise ValueError(f"params.hot must be a fraction in [0, 1], got {hot!r}")
        if "empty_rank" in case.params:
            _int_param(case, "empty_rank")

    def make_inputs(self, case, rank, world, seed):
        g = generator(seed)
        n = private_length(case, rank, world, g)
        total = world * int(case.params["bins"])
        ids = torch.randint(0, total, (n,), generator=g, dtype=torch.int64)
        hot = float(case.params.get("hot", 0.0))
        if hot > 0 and n:
            # the same few hot bins on every rank: they come from the case, not from the rank's seed
            hot_bins = torch.randint(0, total, (self.HOT_BINS,), generator=generator(total * 7919 + int(case.shape[0])))
            pick = torch.rand(n, generator=g) < hot
            ids[pick] = hot_bins[torch.randint(0, self.HOT_BINS, (int(pick.sum()),), generator=g)]
        return {"x": ids.to(torch.int32)}

    def call(self, fns, inputs, case, rank, world):
        y = fns["histogram"](inputs["x"], int(case.params["bins"]))
        return {"y": expect_tensor(y, "histogram's return value")}

    def expected(self, case, world, inputs):
        bins = int(case.params["bins"])
        ids = torch.cat([i["x"].to(torch.int64) for i in inputs])
        counts = torch.bincount(ids, minlength=world * bins).to(torch.int32)
        return [{"y": counts[r * bins:(r + 1) * bins].clone()} for r in range(world)]

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = {"bins": 256, **perf.params}
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[max(1, size_bytes // 4)], dtype="int32",
                        params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * 4


# ----------------------------------------------------------------------------------------------------------------
@register
class BarrierRounds(AllGatherCat):
    """`barrier_rounds(x) -> y`: `rounds` rounds of publish / barrier / read; y[q * rounds + k] = x_q[k].

    The output is the all-gather of every rank's per-round values (AllGatherCat's semantics, reused), but a
    kernel must produce it round by round through a device-side barrier (the card keeps inputs and outputs
    private, so values can only travel through the ranks' scratch). Shape [rounds], 1-D. nccl-tests size: the
    bytes of one rank's values, so that a size means the same number of rounds at every world size.
    """

    name = "barrier_rounds"
    nccl_op = None
    functions = ("barrier_rounds",)
    MAX_ROUNDS = 65535  # the reference packs the round into 16 bits of its flag values

    def validate_case(self, case):
        if len(case.shape) != 1 or not 1 <= case.shape[0] <= self.MAX_ROUNDS:
            raise ValueError(f"shape must be [rounds] with 1 <= rounds <= {self.MAX_ROUNDS}")

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["barrier_rounds"](inputs["x"]), "barrier_rounds's return value")}

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        elem = torch.empty((), dtype=to_dtype(perf.dtype)).element_size()
        rounds = min(self.MAX_ROUNDS, max(1, size_bytes // elem))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[rounds], dtype=perf.dtype,
                        params=dict(perf.params))

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * torch.empty((), dtype=to_dtype(case.dtype)).element_size()
