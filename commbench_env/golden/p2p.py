"""Point-to-point patterns: shifts around a ring, pipeline hand-offs, halo exchanges."""

from __future__ import annotations

import math

import torch

from . import register
from .base import DTYPE_MAP, CandidateError, GoldenOp, expect_tensor, generator, rand, to_dtype
from .compare import compare_tensor


@register
class RingShift(GoldenOp):
    """`ring_shift(x) -> y`: rank r returns the x of rank (r - 1) mod world."""

    name = "ring_shift"
    nccl_op = "sendrecv"
    functions = ("ring_shift",)

    def make_inputs(self, case, rank, world, seed):
        return {"x": rand(case.shape, case.dtype, generator(seed))}

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["ring_shift"](inputs["x"]), "ring_shift's return value")}

    def expected(self, case, world, inputs):
        return [{"y": inputs[(r - 1) % world]["x"].clone()} for r in range(world)]


# ---- pipeline hand-off of a dict of tensors ------------------------------------------------------------------

_NAME_WORDS = ("hidden", "act", "grad", "mask", "pos", "kv", "scale", "ids", "state", "resid", "logits", "aux")
_NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
_WILD_CHARS = _NAME_CHARS + "ABCXYZ.:/-[]() #@+="
#: tensors of the benchmark layout: the size is split evenly over this many 1-D tensors
_BENCH_KEYS = 4


def _randint(gen, low: int, high: int) -> int:
    """Uniform integer in [low, high] (both ends included)."""
    return int(torch.randint(low, high + 1, (1,), generator=gen).item())


def _key_name(gen, wild: bool, taken: set[str]) -> str:
    while True:
        if wild:
            chars = _WILD_CHARS
            name = "".join(chars[_randint(gen, 0, len(chars) - 1)] for _ in range(_randint(gen, 1, 40)))
        else:
            word = _NAME_WORDS[_randint(gen, 0, len(_NAME_WORDS) - 1)]
            suffix = "".join(_NAME_CHARS[_randint(gen, 0, len(_NAME_CHARS) - 1)] for _ in range(_randint(gen, 0, 6)))
            name = f"layer{_randint(gen, 0, 47)}.{word}" + (f"_{suffix}" if suffix else "")
        if name not in taken:
            taken.add(name)
            return name


def _random_shape(gen, max_numel: int, max_ndim: int, p_empty: float) -> list[int]:
    ndim = _randint(gen, 0, max_ndim)
    if ndim == 0:
        return []
    cap = max(1, int(round(max_numel ** (1.0 / ndim))))
    shape = [_randint(gen, 1, cap) for _ in range(ndim)]
    while math.prod(shape) > max_numel:  # rounding of the root can overshoot by a little
        i = max(range(ndim), key=lambda d: shape[d])
        shape[i] -= 1
    if p_empty > 0 and float(torch.rand((), generator=gen)) < p_empty:
        shape[_randint(gen, 0, ndim - 1)] = 0
    return shape


@register
class PipelineSendDict(GoldenOp):
    """`pipeline_shift(tensors: dict[str, Tensor]) -> dict[str, Tensor]`: stage r returns the dict of stage r - 1.

    Each rank's dict is drawn from its own seed: 1-5 keys (card `params.keys = [lo, hi]`), random names, dtypes
    from `params.dtypes` (default: the case dtype), shapes of 0-`params.max_ndim` dims with at most `shape[0]`
    elements (a dim is 0 with probability `params.p_empty`); `params.noncontig` makes the tensors strided views;
    `params.wild_names` draws names with punctuation and spaces. The benchmark layout (`params.layout = "bench"`)
    is `_BENCH_KEYS` 1-D tensors of `shape[0]` elements of the case dtype. Outputs are named "t:<key>"; the key
    set, dtypes and values must match the sender's exactly (a transfer, not arithmetic: no tolerance).
    """

    name = "pipeline_send_dict"
    nccl_op = "sendrecv"
    functions = ("pipeline_shift",)
    prefix = "t:"

    def validate_case(self, case):
        if len(case.shape) != 1 or case.shape[0] < 1:
            raise ValueError("shape must be [max_numel] with max_numel >= 1 (the largest tensor of the dict)")
        p = case.params
        unknown = set(p) - {"keys", "dtypes", "max_ndim", "p_empty", "noncontig", "wild_names", "layout"}
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}")
        keys = p.get("keys", [1, 5])
        if (not isinstance(keys, list) or len(keys) != 2 or not all(type(k) is int for k in keys)
                or not 1 <= keys[0] <= keys[1]):
            raise ValueError("params.keys must be [lo, hi] with 1 <= lo <= hi")
        for d in p.get("dtypes", [case.dtype]):
            if d not in DTYPE_MAP:
                raise ValueError(f"params.dtypes: unknown dtype {d!r}")
        if not 0 <= int(p.get("max_ndim", 3)) <= 6:
            raise ValueError("params.max_ndim must be in [0, 6]")
        if not 0.0 <= float(p.get("p_empty", 0.1)) <= 1.0:
            raise ValueError("params.p_empty must be a probability")
        if p.get("layout", "random") not in ("random", "bench"):
            raise ValueError("params.layout must be 'random' or 'bench'")

    def make_inputs(self, case, rank, world, seed):
        p = case.params
        gen = generator(seed)
        max_numel = int(case.shape[0])
        taken: set[str] = set()
        out: dict[str, torch.Tensor] = {}
        if p.get("layout", "random") == "bench":
            for _ in range(_BENCH_KEYS):
                out[self.prefix + _key_name(gen, False, taken)] = rand([max_numel], case.dtype, gen)
            return out
        lo, hi = p.get("keys", [1, 5])
        pool = list(p.get("dtypes", [case.dtype]))
        max_ndim, p_empty = int(p.get("max_ndim", 3)), float(p.get("p_empty", 0.1))
        noncontig, wild = bool(p.get("noncontig", False)), bool(p.get("wild_names", False))
        for _ in range(_randint(gen, lo, hi)):
            name = _key_name(gen, wild, taken)
            dtype = pool[_randint(gen, 0, len(pool) - 1)]
            shape = _random_shape(gen, max_numel, max_ndim, p_empty)
            if noncontig and len(shape) >= 2:
                t = rand(shape[::-1], dtype, gen).permute(*reversed(range(len(shape))))
            elif noncontig and len(shape) == 1:
                t = rand([2 * shape[0]], dtype, gen)[::2]
            else:
                t = rand(shape, dtype, gen)
            out[self.prefix + name] = t
        return out

    def call(self, fns, inputs, case, rank, world):
        n = len(self.prefix)
        given = {k[n:]: v for k, v in inputs.items() if k.startswith(self.prefix)}
        got = fns["pipeline_shift"](given)
        if type(got) is not dict:
            raise CandidateError(f"pipeline_shift must return a dict, got {type(got).__name__}")
        out: dict[str, torch.Tensor] = {}
        for k, v in got.items():
            if type(k) is not str:
                raise CandidateError(f"pipeline_shift's dict keys must be str, got {type(k).__name__}")
            out[self.prefix + k] = expect_tensor(v, f"pipeline_shift's value for key {k!r}")
        return out

    def expected(self, case, world, inputs):
        return [{k: v.clone() for k, v in inputs[(r - 1) % world].items() if k.startswith(self.prefix)}
                for r in range(world)]

    def verify(self, case, world, inputs, outputs, tol):
        expected = self.expected(case, world, inputs)
        n = len(self.prefix)
        for r in range(world):
            exp, out = expected[r], outputs[r]
            src = (r - 1) % world
            for name in exp:
                if name not in out:
                    return {"case": case.name, "rank": r, "output": name, "reason": "missing",
                            "detail": f"rank {r}'s dict has no key {name[n:]!r}, which rank {src} sent"}
            for name in out:
                if name not in exp:
                    return {"case": case.name, "rank": r, "output": name, "reason": "semantics",
                            "detail": f"rank {r}'s dict has a key {name[n:]!r} that rank {src} did not send"}
            for name, e in exp.items():
                g = out[name]
                if g.dtype != e.dtype:
                    return {"case": case.name, "rank": r, "output": name, "reason": "dtype",
                            "expected": str(e.dtype), "got": str(g.dtype)}
                m = compare_tensor(e, g, (0.0, 0.0))  # a transfer is bit-exact
                if m:
                    m.update(case=case.name, rank=r, output=name)
                    return m
        return None

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        elem = torch.empty((), dtype=to_dtype(perf.dtype)).element_size()
        count = max(1, size_bytes // (elem * _BENCH_KEYS))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[count], dtype=perf.dtype,
                        params={**perf.params, "layout": "bench"})

    def metric_bytes(self, case, world):
        p = case.params
        if p.get("layout", "random") == "bench":
            return _BENCH_KEYS * int(case.shape[0]) * torch.empty((), dtype=to_dtype(case.dtype)).element_size()
        # random layout: the largest dict the case can draw (used only to pick the profiled case)
        widest = max(torch.empty((), dtype=to_dtype(d)).element_size() for d in p.get("dtypes", [case.dtype]))
        return int(p.get("keys", [1, 5])[1]) * int(case.shape[0]) * widest


# ---- periodic 1-D halo exchange ------------------------------------------------------------------------------

@register
class HaloExchange1D(GoldenOp):
    """`halo_exchange(local, halo) -> y`: y = [left neighbour's last h | local | right neighbour's first h].

    Periodic: the left neighbour of rank r is (r - 1) mod world, the right one (r + 1) mod world. `local` has
    shape [n] (the case shape) and h = `params.halo`, 0 <= h <= n. nccl-tests size: the 2h elements a rank sends.
    """

    name = "halo_exchange_1d"
    nccl_op = "sendrecv"
    functions = ("halo_exchange",)

    def validate_case(self, case):
        if len(case.shape) != 1 or case.shape[0] < 1:
            raise ValueError("shape must be [n] with n >= 1")
        h = case.params.get("halo")
        if type(h) is not int or not 0 <= h <= case.shape[0]:
            raise ValueError(f"params.halo must be an int in [0, n={case.shape[0]}], got {h!r}")

    def make_inputs(self, case, rank, world, seed):
        return {"local": rand(case.shape, case.dtype, generator(seed))}

    def call(self, fns, inputs, case, rank, world):
        y = fns["halo_exchange"](inputs["local"], int(case.params["halo"]))
        return {"y": expect_tensor(y, "halo_exchange's return value")}

    def expected(self, case, world, inputs):
        h, n = int(case.params["halo"]), int(case.shape[0])
        out = []
        for r in range(world):
            left, right = inputs[(r - 1) % world]["local"], inputs[(r + 1) % world]["local"]
            out.append({"y": torch.cat([left[n - h:], inputs[r]["local"], right[:h]])})
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        elem = torch.empty((), dtype=to_dtype(perf.dtype)).element_size()
        h = max(1, size_bytes // (2 * elem))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[2 * h], dtype=perf.dtype,
                        params={**perf.params, "halo": h})

    def metric_bytes(self, case, world):
        return 2 * int(case.params["halo"]) * torch.empty((), dtype=to_dtype(case.dtype)).element_size()


# ---- ping-pong of a ball between rank pairs --------------------------------------------------------------------

def _wrap_u32(v: int) -> int:
    """v modulo 2**32, as the int32 with the same bits (the ball is a uint32 that wraps)."""
    v &= 0xFFFF_FFFF
    return v - (1 << 32) if v >= (1 << 31) else v


@register
class PingPongChain(GoldenOp):
    """`pingpong(x) -> y`: ranks 2i and 2i+1 bounce a ball `rounds` times; each returns the balls it received.

    x holds this rank's `rounds` keys (int32). The pinger (even rank) starts with ball = 0; in round k it adds
    x[k] and sends the ball; the ponger records what it received in y[k], adds its own x[k] and sends it back; the
    pinger records the reply in y[k] and goes on. Arithmetic wraps modulo 2**32. Every y[k] depends on all keys
    of both ranks up to round k, so the rounds must happen in order; keys are full-range random, so a stale or
    skipped message shows up as a wrong value. Worlds are even (pairs); nccl-tests size: the keys' bytes.
    """

    name = "pingpong_chain"
    nccl_op = None
    functions = ("pingpong",)
    MAX_ROUNDS = 65535  # the reference packs the round into 16 bits of its sequence numbers

    def validate_case(self, case):
        if case.dtype != "int32":
            raise ValueError("dtype must be int32 (the keys and balls are 32-bit integers)")
        if len(case.shape) != 1 or not 1 <= case.shape[0] <= self.MAX_ROUNDS:
            raise ValueError(f"shape must be [rounds] with 1 <= rounds <= {self.MAX_ROUNDS}")

    def supports_world(self, world, case):
        return world % 2 == 0

    def make_inputs(self, case, rank, world, seed):
        keys = torch.randint(-(1 << 31), 1 << 31, (int(case.shape[0]),), generator=generator(seed), dtype=torch.int64)
        return {"x": keys.to(torch.int32)}

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["pingpong"](inputs["x"]), "pingpong's return value")}

    def expected(self, case, world, inputs):
        if world % 2:
            raise ValueError(f"pingpong pairs ranks up: world {world} is odd")
        out: list[dict[str, torch.Tensor]] = []
        for ping in range(0, world, 2):
            keys_ping, keys_pong = inputs[ping]["x"].tolist(), inputs[ping + 1]["x"].tolist()
            got_ping, got_pong = [], []
            ball = 0
            for k_ping, k_pong in zip(keys_ping, keys_pong):
                ball = _wrap_u32(ball + k_ping)
                got_pong.append(ball)
                ball = _wrap_u32(ball + k_pong)
                got_ping.append(ball)
            out += [{"y": torch.tensor(got_ping, dtype=torch.int32)}, {"y": torch.tensor(got_pong, dtype=torch.int32)}]
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        rounds = min(self.MAX_ROUNDS, max(1, size_bytes // 4))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[rounds], dtype="int32",
                        params=dict(perf.params))
