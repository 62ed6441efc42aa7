"""Collectives: the golden semantics of all-reduce, all-gather, reduce-scatter, broadcast and all-to-all."""

from __future__ import annotations

import torch

from . import register
from .base import GoldenOp, expect_tensor, generator, narrow, rand, wide


@register
class AllReduceSum(GoldenOp):
    """`all_reduce(x) -> y`: every rank returns the element-wise sum of all ranks' x."""

    name = "all_reduce_sum"
    nccl_op = "all_reduce"
    functions = ("all_reduce",)

    def validate_case(self, case):
        if len(case.shape) < 1:
            raise ValueError("shape must have at least one dimension")

    def make_inputs(self, case, rank, world, seed):
        return {"x": rand(case.shape, case.dtype, generator(seed))}

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["all_reduce"](inputs["x"]), "all_reduce's return value")}

    def expected(self, case, world, inputs):
        total = narrow(torch.stack([wide(i["x"]) for i in inputs]).sum(0), case.dtype)
        return [{"y": total} for _ in range(world)]
