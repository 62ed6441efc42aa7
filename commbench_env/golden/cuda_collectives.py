"""Collectives of the CUDA tasks whose correctness is more than a sum within tolerance.

`all_reduce_fp32_ordered`: a bfloat16 all-reduce whose result is one stated formula, bit for bit: a float32
accumulation in rank order, rounded to bfloat16 once. Its inputs hold "traps": positions where two ranks hold
+2^e and -2^e (e large, public) and the others hold ordinary values, so that a float32 sum in another order (or
float64, or bfloat16 partial sums) rounds differently there and fails bit-exactness.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from . import register
from .base import GoldenOp, expect_tensor, generator, int_param, num_param, rand

TRAP_PERIOD = 1 << 16  # the trap pattern repeats every this many elements (a public pattern, cheap to apply)
TRAP_EXPONENTS = (14, 35)  # 2^e with e in [14, 35): a float32 next to it has an ulp of 2^-9 .. 2^11


def ordered_fp32_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    """bf16(((f32(x_0) + f32(x_1)) + f32(x_2)) + ... + f32(x_{n-1})), every + a float32 addition rounded to nearest
    even, then one round-to-nearest-even to bfloat16: the task's formula, element by element."""
    acc = xs[0].to(torch.float32)
    for x in xs[1:]:
        acc = acc + x.to(torch.float32)  # torch's CPU float32 add: one IEEE addition per element
    return acc.to(torch.bfloat16)


@lru_cache(maxsize=64)
def trap_pattern(world: int, pattern_seed: int, fraction: float) -> tuple[torch.Tensor, ...]:
    """Per rank, (positions, values) within one period: the trap positions where this rank holds a public value
    (+2^e on one rank, -2^e on another, both chosen at random per position); at the other trap positions and
    everywhere else a rank holds its private data. Public: it depends on the case and the world only."""
    if world < 2 or fraction <= 0:
        empty = (torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.bfloat16))
        return tuple(t for _ in range(world) for t in empty)
    g = generator(0x5EED_0000 + 7919 * pattern_seed + world)
    traps = (torch.rand(TRAP_PERIOD, generator=g) < fraction).nonzero().reshape(-1)
    m = traps.numel()
    a = torch.randint(0, world, (m,), generator=g)
    b = (a + torch.randint(1, world, (m,), generator=g)) % world  # another rank than a
    e = torch.randint(*TRAP_EXPONENTS, (m,), generator=g).to(torch.float32)
    sign = torch.randint(0, 2, (m,), generator=g).to(torch.float32) * 2 - 1
    big = (sign * torch.exp2(e)).to(torch.bfloat16)  # a power of two: exact in bfloat16
    out = []
    for r in range(world):
        pos_a, pos_b = a == r, b == r
        pos = torch.cat([traps[pos_a], traps[pos_b]])
        val = torch.cat([big[pos_a], -big[pos_b]])
        out += [pos, val]
    return tuple(out)


@register
class AllReduceFp32Ordered(GoldenOp):
    """`all_reduce(x) -> y`, x bfloat16: every rank returns `ordered_fp32_sum` of all ranks' x, bit for bit.

    params: `trap_fraction` (default 0.25), the share of positions holding a +2^e / -2^e pair on two ranks;
    `pattern_seed` (default 0) picks the public trap pattern. The card's bfloat16 tolerance must be 0: the check
    is bit-exactness (a +0.0 / -0.0 difference aside)."""

    name = "all_reduce_fp32_ordered"
    nccl_op = "all_reduce"
    functions = ("all_reduce",)

    def validate_case(self, case):
        if len(case.shape) < 1:
            raise ValueError("shape must have at least one dimension")
        if case.dtype != "bfloat16":
            raise ValueError(f"dtype must be bfloat16 (the formula rounds to bfloat16), got {case.dtype}")
        num_param(case, "trap_fraction", 0.25, 0.0, 1.0)
        int_param(case, "pattern_seed", 0, 0)

    def validate_card(self, card):
        super().validate_card(card)
        tol = card.tolerance_for("bfloat16")
        if tol.rtol != 0 or tol.atol != 0:
            raise ValueError("field 'tolerance.bfloat16': this op checks bit-exactness; set rtol = 0 and atol = 0")

    @staticmethod
    def _pattern(case, world):
        return trap_pattern(world, int_param(case, "pattern_seed", 0, 0),
                            num_param(case, "trap_fraction", 0.25, 0.0, 1.0))

    def make_inputs(self, case, rank, world, seed):
        x = rand(case.shape, "bfloat16", generator(seed))
        pattern = self._pattern(case, world)
        pos, val = pattern[2 * rank], pattern[2 * rank + 1]
        if pos.numel():
            flat = x.reshape(-1)
            n = flat.numel()
            full = n // TRAP_PERIOD
            if full:
                flat[:full * TRAP_PERIOD].view(full, TRAP_PERIOD)[:, pos] = val
            rem = n - full * TRAP_PERIOD
            keep = pos < rem
            flat[full * TRAP_PERIOD:][pos[keep]] = val[keep]
        return {"x": x}

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["all_reduce"](inputs["x"]), "all_reduce's return value")}

    def expected(self, case, world, inputs):
        y = ordered_fp32_sum([i["x"] for i in inputs])
        return [{"y": y} for _ in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        numel = math.prod(int(s) for s in case.shape)
        flats = [i["x"].reshape(-1) for i in inputs]
        return [{"y": ordered_fp32_sum([f[idx] for f in flats])}
                for idx in (pick(r, "y", numel) for r in range(world))]
