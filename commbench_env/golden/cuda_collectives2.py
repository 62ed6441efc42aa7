"""Collectives of the second wave of CUDA tasks whose semantics no earlier op states.

`reduce_sum_root`: a reduce (sum) whose result only one rank, the root, receives. Every other rank has an empty
output (zero elements), so nothing is asked of it beyond its share of the work, and a timed call's sampled check
looks at the root alone. (collective/alltoallv_ipc reuses `all_to_all_v_counts` of collective_algorithms.py.)
"""

from __future__ import annotations

import math

import torch

from . import register
from .base import GoldenOp, expect_tensor, generator, int_range, narrow, rand, to_dtype, wide


def _empty(dtype: str) -> torch.Tensor:
    """A zero-element output in the candidate's dtype family (float64 for floats, as `narrow` leaves them)."""
    dt = to_dtype(dtype)
    return torch.empty(0, dtype=torch.float64 if dt.is_floating_point else dt)


@register
class ReduceSumRoot(GoldenOp):
    """`reduce(x, root) -> y`: the root returns the element-wise sum of every rank's x; every other rank's output
    is empty (zero elements: a non-root rank returns nothing and its output buffer has no elements).

    `params.root` picks the root; a negative value counts from the end (-1 = the last rank), and a root outside
    the world skips the case for that world size. Every rank's x holds data. nccl-tests size: the bytes of x."""

    name = "reduce_sum_root"
    nccl_op = "reduce"  # busbw = algbw (nccl-tests' factor 1 for a reduce)
    functions = ("reduce",)

    @staticmethod
    def root(case, world: int) -> int:
        root = int(case.params.get("root", 0))
        return root + world if root < 0 else root

    def validate_case(self, case):
        if len(case.shape) < 1:
            raise ValueError("shape must have at least one dimension")
        unknown = set(case.params) - {"root"}
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}; known: root")
        root = case.params.get("root", 0)
        if type(root) is not int:
            raise ValueError(f"params.root must be an int, got {root!r}")

    def supports_world(self, world, case):
        return 0 <= self.root(case, world) < world

    def make_inputs(self, case, rank, world, seed):
        return {"x": rand(case.shape, case.dtype, generator(seed), **int_range(case))}

    def call(self, fns, inputs, case, rank, world):
        root = self.root(case, world)
        y = fns["reduce"](inputs["x"], root)
        if rank != root:
            return {"y": _empty(case.dtype).to(to_dtype(case.dtype))}  # whatever a non-root returns is not used
        return {"y": expect_tensor(y, "reduce's return value on the root")}

    def expected(self, case, world, inputs):
        root = self.root(case, world)
        total = narrow(torch.stack([wide(i["x"]) for i in inputs]).sum(0), case.dtype)
        return [{"y": total} if r == root else {"y": _empty(case.dtype)} for r in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        root = self.root(case, world)
        numel = math.prod(int(s) for s in case.shape)
        flats = [i["x"].reshape(-1) for i in inputs]
        out = []
        for r in range(world):
            if r != root:
                pick(r, "y", 0)  # an empty output: nothing drawn, nothing checked
                out.append({"y": _empty(case.dtype)})
                continue
            idx = pick(r, "y", numel)
            out.append({"y": narrow(torch.stack([wide(f[idx]) for f in flats]).sum(0), case.dtype)})
        return out
