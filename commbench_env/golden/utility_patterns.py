"""Golden semantics of the first task wave (issue #22): utility_patterns.

- `tp_dp_grid_reduce`: a sum over the tensor-parallel group and a max over the data-parallel group of a TP x DP
  grid of ranks (utility/subgroup_grid);
- `object_broadcast`: a Python dict of str -> list of ints broadcast from a root (utility/object_broadcast);
- `vocab_softmax_stats`: the log-sum-exp and the argmax of every row of a vocabulary split unevenly over the ranks
  (utility/debug_collective_order).

The other debugging tasks reuse the ops of collectives.py (all_to_all, reduce_scatter_sum) and fusion.py
(allgather_matmul).
"""

from __future__ import annotations

import functools

import math

import torch

from . import register
from .base import (CandidateError, GoldenOp, elem_size as _elem, expect_tensor, generator, int_param, narrow, num_param,
                   to_dtype, wide)
from .compare import first_mismatch

_int_param = functools.partial(int_param, optional=True)
_num_param = num_param

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _pair(value, what: str, low: int) -> tuple[int, int]:
    if (not isinstance(value, list) or len(value) != 2 or not all(type(x) is int for x in value)
            or not low <= value[0] <= value[1]):
        raise ValueError(f"{what} must be [lo, hi] with {low} <= lo <= hi, got {value!r}")
    return value[0], value[1]


def _as_pair(res, fn: str, names: tuple[str, str]) -> dict[str, torch.Tensor]:
    if not isinstance(res, (tuple, list)) or len(res) != 2:
        raise CandidateError(f"{fn} must return a tuple of two tensors ({names[0]}, {names[1]}), got "
                             f"{type(res).__name__}" + (f" of length {len(res)}" if isinstance(res, (tuple, list)) else ""))
    return {n: expect_tensor(t, f"{fn}(...)[{i}] ({n})") for i, (n, t) in enumerate(zip(names, res))}


def _check_dtypes(case, outputs, want: dict[str, torch.dtype]) -> dict | None:
    for r, out in enumerate(outputs):
        for name, dt in want.items():
            t = out.get(name)
            if isinstance(t, torch.Tensor) and t.dtype != dt:
                return {"case": case.name, "rank": r, "output": name, "reason": "dtype", "expected": str(dt),
                        "got": str(t.dtype), "detail": f"{name} must have dtype {dt}"}
    return None


# ----------------------------------------------------------------------------------------------------------------
@register
class TpDpGridReduce(GoldenOp):
    """`grid_reduce(x, tp_size) -> (tp_sum, dp_max)` over a Megatron-style TP x DP grid of ranks.

    Rank r has tp_rank = r % tp and dp_rank = r // tp: its tensor-parallel group is the tp consecutive ranks
    dp_rank*tp .. dp_rank*tp + tp - 1, its data-parallel group the ranks tp_rank, tp_rank + tp, tp_rank + 2tp, ...
    tp_sum is the element-wise sum of x over the TP group, dp_max the element-wise max over the DP group, both in
    x's dtype. Card cases: shape = x's shape; params.tp = the TP size, or params.dp = the DP size (tp = world / dp);
    a world that the size does not divide skips the case. Benchmark: a flat x, tp = params.tp (default 2) where it
    divides the world, else tp = world.
    """

    name = "tp_dp_grid_reduce"
    nccl_op = None
    functions = ("grid_reduce",)

    def validate_case(self, case):
        if len(case.shape) < 1:
            raise ValueError("shape must have at least one dimension")
        if case.dtype == "bool":
            raise ValueError("dtype bool has no sum")
        given = [k for k in ("tp", "dp") if k in case.params]
        if len(given) != 1:
            raise ValueError("give exactly one of params.tp and params.dp")
        _int_param(case, given[0], low=1)

    def tp(self, case, world: int) -> int | None:
        """The TP size of a case at this world size; None if the grid does not fit."""
        p = case.params
        if p.get("bench"):
            tp = int(p.get("tp", 2))
            return tp if world % tp == 0 else world
        if "tp" in p:
            tp = int(p["tp"])
            return tp if world % tp == 0 else None
        dp = int(p["dp"])
        return world // dp if world % dp == 0 else None

    def supports_world(self, world, case):
        return self.tp(case, world) is not None

    def make_inputs(self, case, rank, world, seed):
        from .base import int_range, rand

        return {"x": rand(case.shape, case.dtype, generator(seed), **int_range(case))}

    def call(self, fns, inputs, case, rank, world):
        res = fns["grid_reduce"](inputs["x"], self.tp(case, world))
        return _as_pair(res, "grid_reduce", ("tp_sum", "dp_max"))

    def expected(self, case, world, inputs):
        tp = self.tp(case, world)
        out = []
        for r in range(world):
            tp_group = [r // tp * tp + j for j in range(tp)]
            dp_group = list(range(r % tp, world, tp))
            s = narrow(torch.stack([wide(inputs[q]["x"]) for q in tp_group]).sum(0), case.dtype)
            m = torch.stack([inputs[q]["x"] for q in dp_group]).amax(0)
            out.append({"tp_sum": s, "dp_max": m})
        return out

    def verify(self, case, world, inputs, outputs, tol):
        dt = to_dtype(case.dtype)
        return (_check_dtypes(case, outputs, {"tp_sum": dt, "dp_max": dt})
                or first_mismatch(case, self.expected(case, world, inputs), outputs, tol))

    def verifies_whole_outputs(self):
        return False  # verify() only adds dtype checks to the element-wise comparison: samples suffice

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        count = max(1, size_bytes // _elem(perf.dtype))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[count], dtype=perf.dtype,
                        params={**perf.params, "bench": True})


# ----------------------------------------------------------------------------------------------------------------
# A dict of str -> list[int] travels between harness and coordinator as four tensors: the UTF-8 bytes of the keys
# (concatenated in the dict's order), each key's byte length, the values of all lists (concatenated in the same
# order) and each list's length.
_OBJ_KEYS = ("key_bytes", "key_lens", "values", "value_lens")
_BENCH_KEYS = 8


def _encode_object(obj: dict) -> dict[str, torch.Tensor]:
    raw = [k.encode("utf-8", "surrogatepass") for k in obj]
    blob = b"".join(raw)
    values = [v for vals in obj.values() for v in vals]
    return {
        "key_bytes": torch.frombuffer(bytearray(blob), dtype=torch.uint8).clone() if blob
        else torch.zeros(0, dtype=torch.uint8),
        "key_lens": torch.tensor([len(b) for b in raw], dtype=torch.int64),
        "values": torch.tensor(values, dtype=torch.int64),
        "value_lens": torch.tensor([len(v) for v in obj.values()], dtype=torch.int64),
    }


def _decode_object(t: dict[str, torch.Tensor]) -> dict[str, list[int]]:
    blob = bytes(t["key_bytes"].cpu().tolist())
    klens, values, vlens = t["key_lens"].tolist(), t["values"].cpu().tolist(), t["value_lens"].tolist()
    out: dict[str, list[int]] = {}
    kpos = vpos = 0
    for kl, vl in zip(klens, vlens):
        out[blob[kpos:kpos + kl].decode("utf-8", "surrogatepass")] = values[vpos:vpos + vl]
        kpos += kl
        vpos += vl
    return out


def _random_char(gen, chars: str) -> str:
    u = float(torch.rand((), generator=gen, dtype=torch.float64))
    pick = lambda lo, hi: chr(int(torch.randint(lo, hi + 1, (1,), generator=gen)))  # noqa: E731
    if chars == "ascii" or u < 0.4:
        return pick(0x20, 0x7E)
    if u < 0.5:
        return pick(0x00, 0x1F)  # control characters, NUL included
    if u < 0.75:
        c = pick(0x80, 0xFFFD)
        return c if not 0xD800 <= ord(c) <= 0xDFFF else "\u00e9"  # no lone surrogates: not text
    return pick(0x10000, 0x10FFFF)


@register
class ObjectBroadcast(GoldenOp):
    """`broadcast_object(obj, root, device) -> dict`: every rank returns the root's dict of str -> list[int].

    Card cases: shape = [n_keys, max_len]: the root's dict has exactly n_keys keys (0: an empty dict), each list
    0..max_len ints (exactly max_len with layout = "bench"); the values are int64 (the full range unless the case
    sets int_range). params: root (negative counts from the end; a root outside the world skips the case),
    key_len = [lo, hi] characters per key (default [1, 16]), chars = "ascii" (printable ASCII, the default) or "any"
    (control characters with NUL, non-ASCII and astral code points). The other ranks get obj = None. Checked:
    the keys in the root's order, and every list exactly. Benchmark: 8 keys of 16 ASCII characters, lists of
    size / 64 ints each.
    """

    name = "object_broadcast"
    nccl_op = None
    functions = ("broadcast_object",)

    @staticmethod
    def root(case, world: int) -> int:
        root = int(case.params.get("root", 0))
        return root + world if root < 0 else root

    def validate_case(self, case):
        if case.dtype != "int64":
            raise ValueError("dtype must be int64 (the values of the lists)")
        if len(case.shape) != 2 or not 0 <= case.shape[0] <= 4096:
            raise ValueError("shape must be [n_keys, max_len] with 0 <= n_keys <= 4096")
        unknown = set(case.params) - {"root", "key_len", "chars", "layout"}
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}")
        _int_param(case, "root", 0)
        lo, hi = _pair(case.params.get("key_len", [1, 16]), "params.key_len", 0)
        if case.params.get("chars", "ascii") not in ("ascii", "any"):
            raise ValueError("params.chars must be 'ascii' or 'any'")
        if case.params.get("layout", "random") not in ("random", "bench"):
            raise ValueError("params.layout must be 'random' or 'bench'")
        if hi == 0 and case.shape[0] > 1:
            raise ValueError("keys of length 0 leave room for one key only")
        if case.int_range is not None and not INT64_MIN <= case.int_range[0] < case.int_range[1] <= INT64_MAX:
            raise ValueError("int_range must lie in the int64 range")

    def supports_world(self, world, case):
        return 0 <= self.root(case, world) < world

    def obj(self, case, seed: int) -> dict[str, list[int]]:
        """The root's dict, from its seed."""
        gen = generator(seed)
        n_keys, max_len = (int(s) for s in case.shape)
        p = case.params
        bench = p.get("layout", "random") == "bench"
        lo, hi = p.get("key_len", [1, 16])
        chars = p.get("chars", "ascii")
        low, high = case.int_range or [INT64_MIN, INT64_MAX]
        out: dict[str, list[int]] = {}
        while len(out) < n_keys:
            length = int(torch.randint(lo, hi + 1, (1,), generator=gen))
            key = "".join(_random_char(gen, chars) for _ in range(length))
            if key in out:
                continue
            n = max_len if bench else int(torch.randint(0, max_len + 1, (1,), generator=gen))
            out[key] = torch.randint(low, high, (n,), generator=gen, dtype=torch.int64).tolist()
        return out

    def make_inputs(self, case, rank, world, seed):
        if rank == self.root(case, world):
            return _encode_object(self.obj(case, seed))
        # the other ranks learn nothing about the root's dict from their inputs
        return {"key_bytes": torch.zeros(0, dtype=torch.uint8),
                **{k: torch.zeros(0, dtype=torch.int64) for k in _OBJ_KEYS[1:]}}

    def call(self, fns, inputs, case, rank, world):
        root = self.root(case, world)
        device = inputs["value_lens"].device
        obj = _decode_object(inputs) if rank == root else None
        got = fns["broadcast_object"](obj, root, device)
        if type(got) is not dict:
            raise CandidateError(f"broadcast_object must return a dict, got {type(got).__name__}")
        for k, v in got.items():
            if type(k) is not str:
                raise CandidateError(f"broadcast_object's dict keys must be str, got {type(k).__name__}")
            if type(v) is not list:
                raise CandidateError(f"broadcast_object's value for key {ascii(k)} must be a list, got "
                                     f"{type(v).__name__}")
            for i, x in enumerate(v):
                if type(x) is not int:
                    raise CandidateError(f"broadcast_object's value for key {ascii(k)} holds a "
                                         f"{type(x).__name__} at index {i}; the lists hold Python ints")
                if not INT64_MIN <= x <= INT64_MAX:
                    raise CandidateError(f"broadcast_object's value for key {ascii(k)} holds {x} at index {i}, "
                                         "outside the int64 range of the root's values")
        return _encode_object(got)

    def expected(self, case, world, inputs):
        want = inputs[self.root(case, world)]
        return [{k: want[k].clone() for k in _OBJ_KEYS} for _ in range(world)]

    def verify(self, case, world, inputs, outputs, tol):
        root = self.root(case, world)
        want = _decode_object(inputs[root])
        keys = list(want)
        for r in range(world):
            if any(k not in outputs[r] for k in _OBJ_KEYS):
                return {"case": case.name, "rank": r, "output": "dict", "reason": "missing",
                        "detail": f"rank {r} returned no dict"}
            got = _decode_object(outputs[r])

            def bad(reason: str, detail: str, expected: str = "", got_: str = "", index=None) -> dict:
                return {"case": case.name, "rank": r, "output": "dict", "reason": reason, "detail": detail,
                        "expected": expected, "got": got_, "index": index or []}

            missing = [k for k in keys if k not in got]
            extra = [k for k in got if k not in want]
            if missing:
                return bad("missing", f"rank {r}'s dict has no key {ascii(missing[0])}, which the root's dict has "
                           f"({len(missing)} of the root's {len(keys)} keys missing)")
            if extra:
                return bad("semantics", f"rank {r}'s dict has a key {ascii(extra[0])} that the root's dict does not "
                           f"have ({len(extra)} such keys)")
            order = list(got)
            if order != keys:
                i = next(i for i, (a, b) in enumerate(zip(keys, order)) if a != b)
                return bad("semantics", f"rank {r}'s dict holds the root's keys in another order: key #{i} is "
                           f"{ascii(order[i])}, the root's key #{i} is {ascii(keys[i])} (keep the root's order)",
                           ascii(keys[i]), ascii(order[i]), [i])
            for k in keys:
                a, b = want[k], got[k]
                if len(a) != len(b):
                    return bad("shape", f"rank {r}: the list of key {ascii(k)} has {len(b)} ints, the root's has "
                               f"{len(a)}", str(len(a)), str(len(b)))
                j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
                if j is not None:
                    return bad("value", f"rank {r}: the list of key {ascii(k)} differs from the root's at index "
                               f"{j}", str(a[j]), str(b[j]), [j])
        return None

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        n = max(1, size_bytes // (8 * _BENCH_KEYS))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[_BENCH_KEYS, n], dtype="int64",
                        params={"key_len": [16, 16], **perf.params, "layout": "bench"})

    def metric_bytes(self, case, world):
        n_keys, max_len = (int(s) for s in case.shape)
        hi = case.params.get("key_len", [1, 16])[1]
        if case.params.get("layout", "random") == "bench":
            return n_keys * (8 * max_len + hi)
        return n_keys * (8 * max_len // 2 + hi)  # lists are 0..max_len long


# ----------------------------------------------------------------------------------------------------------------
def _vocab_split(vocab: int, world: int, rank: int) -> tuple[int, int]:
    """(first id, width) of rank's columns: torch.tensor_split's split of range(vocab) into world parts."""
    base, extra = divmod(vocab, world)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


@register
class VocabSoftmaxStats(GoldenOp):
    """`softmax_stats(logits, vocab_size) -> (lse, argmax)` over a vocabulary split unevenly over the ranks.

    case.shape = [B, V], the full logit matrix; rank r holds the columns of torch.tensor_split(range(V), world)[r]
    (the first V % world ranks one more than the others; none when V < world and r >= V). Every rank returns
    lse[b] = log(sum_j exp(logits[b, j])) over the whole vocabulary (any floating dtype, compared in float64 within
    the case dtype's tolerance) and argmax[b] = the smallest vocabulary id j with the largest logits[b, j] (int64).
    params: scale and shift (logits = N(0, 1) * scale + shift, default 1 and 0), rank_shift (rank r's shard is
    shifted by rank_shift * r), ties = t > 0: integer logits in [0, t) instead, so that maxima repeat across ranks.
    Benchmark: V = world * params.vocab_per_rank, B = size / (vocab_per_rank * element size).
    """

    name = "vocab_softmax_stats"
    nccl_op = None
    functions = ("softmax_stats",)

    def validate_case(self, case):
        if len(case.shape) != 2 or any(int(s) < 1 for s in case.shape):
            raise ValueError(f"shape must be [batch, vocab] with both >= 1, got {case.shape}")
        if not to_dtype(case.dtype).is_floating_point:
            raise ValueError(f"dtype must be a floating type, got {case.dtype}")
        for key, default in (("scale", 1.0), ("shift", 0.0), ("rank_shift", 0.0)):
            _num_param(case, key, default)
        _int_param(case, "ties", 0, low=0)
        unknown = set(case.params) - {"scale", "shift", "rank_shift", "ties", "vocab_per_rank"}
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}")

    def make_inputs(self, case, rank, world, seed):
        b, vocab = (int(s) for s in case.shape)
        _, width = _vocab_split(vocab, world, rank)
        g = generator(seed)
        ties = int(case.params.get("ties", 0))
        if ties:
            z = torch.randint(0, ties, (b, width), generator=g).to(torch.float64)
        else:
            from .base import rand

            z = rand((b, width), torch.float64, g) * _num_param(case, "scale", 1.0)
            z = z + _num_param(case, "shift", 0.0) + _num_param(case, "rank_shift", 0.0) * rank
        return {"logits": z.to(to_dtype(case.dtype))}

    def call(self, fns, inputs, case, rank, world):
        res = fns["softmax_stats"](inputs["logits"], int(case.shape[1]))
        return _as_pair(res, "softmax_stats", ("lse", "argmax"))

    def _stats(self, inputs, rows) -> tuple[torch.Tensor, torch.Tensor]:
        full = torch.cat([wide(i["logits"][rows]) for i in inputs], dim=1)
        return torch.logsumexp(full, dim=1), torch.argmax(full, dim=1)  # argmax: the first of equal maxima

    def expected(self, case, world, inputs):
        lse, idx = self._stats(inputs, slice(None))
        return [{"lse": lse, "argmax": idx} for _ in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        b = int(case.shape[0])
        out = []
        for r in range(world):
            ia, il = pick(r, "argmax", b), pick(r, "lse", b)  # sorted name order, as the rank drew them
            out.append({"argmax": self._stats(inputs, ia)[1], "lse": self._stats(inputs, il)[0]})
        return out

    def verify(self, case, world, inputs, outputs, tol):
        for r, out in enumerate(outputs):
            lse = out.get("lse")
            if isinstance(lse, torch.Tensor) and not lse.is_floating_point():
                return {"case": case.name, "rank": r, "output": "lse", "reason": "dtype",
                        "expected": "a floating dtype", "got": str(lse.dtype)}
        return (_check_dtypes(case, outputs, {"argmax": torch.int64})
                or first_mismatch(case, self.expected(case, world, inputs), outputs, tol))

    def verifies_whole_outputs(self):
        return False  # verify() only adds dtype checks to the element-wise comparison: samples suffice

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = dict(perf.params)
        v = int(params.pop("vocab_per_rank", 2048))
        b = max(1, size_bytes // (v * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[b, v * world], dtype=perf.dtype,
                        params=params)

    def metric_bytes(self, case, world):
        b, vocab = (int(s) for s in case.shape)
        return b * math.ceil(vocab / world) * _elem(case.dtype)
