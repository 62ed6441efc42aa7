"""Point-to-point patterns: shifts around a ring, pipeline hand-offs, halo exchanges."""

from __future__ import annotations

from . import register
from .base import GoldenOp, expect_tensor, generator, rand


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
