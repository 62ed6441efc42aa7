"""Collectives: the golden semantics of all-reduce, all-gather, reduce-scatter, broadcast and all-to-all."""

from __future__ import annotations

import math

import torch

from . import register
from .base import GoldenOp, elem_size as _elem, expect_tensor, generator, int_range, narrow, rand, to_dtype, wide


def _numel(shape) -> int:
    return math.prod(int(s) for s in shape)


def _per_rank_case(perf, size_bytes: int, world: int, name: str):
    """Benchmark case of an op whose nccl-tests size is `world` blocks: one 1-D block of size_bytes / world."""
    from ..cards import CaseSpec

    count = max(1, size_bytes // (_elem(perf.dtype) * world))
    return CaseSpec(name=name, visible=False, shape=[count], dtype=perf.dtype, params=dict(perf.params))


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
        return {"x": rand(case.shape, case.dtype, generator(seed), **int_range(case))}

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["all_reduce"](inputs["x"]), "all_reduce's return value")}

    def expected(self, case, world, inputs):
        total = narrow(torch.stack([wide(i["x"]) for i in inputs]).sum(0), case.dtype)
        return [{"y": total} for _ in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        numel = _numel(case.shape)
        flats = [i["x"].reshape(-1) for i in inputs]
        out = []
        for r in range(world):
            idx = pick(r, "y", numel)
            out.append({"y": narrow(torch.stack([wide(f[idx]) for f in flats]).sum(0), case.dtype)})
        return out


def _blocks_shape(case, world: int) -> list[int]:
    """Shape of a tensor of `world` blocks stacked along dim 0, each block of the case shape."""
    return [world * int(case.shape[0]), *case.shape[1:]]


def _need_dim(case) -> None:
    if len(case.shape) < 1:
        raise ValueError("shape must have at least one dimension (dim 0 is the block dimension)")


@register
class AllGatherCat(GoldenOp):
    """`all_gather(x) -> y`: y = torch.cat of every rank's x along dim 0, in rank order.

    The case shape is the shape of x, [m, ...]; y has shape [world * m, ...]. nccl-tests size: the gathered
    (output) size, world * x's bytes.
    """

    name = "all_gather_cat"
    nccl_op = "all_gather"
    functions = ("all_gather",)

    def validate_case(self, case):
        _need_dim(case)

    def make_inputs(self, case, rank, world, seed):
        return {"x": rand(case.shape, case.dtype, generator(seed), **int_range(case))}

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["all_gather"](inputs["x"]), "all_gather's return value")}

    def expected(self, case, world, inputs):
        y = torch.cat([i["x"] for i in inputs], dim=0)
        return [{"y": y} for _ in range(world)]

    def size_case(self, perf, size_bytes, world):
        return _per_rank_case(perf, size_bytes, world, f"bench-{size_bytes}")

    def metric_bytes(self, case, world):
        return world * _numel(case.shape) * _elem(case.dtype)


@register
class ReduceScatterSum(GoldenOp):
    """`reduce_scatter(x) -> y`: x has shape [world * m, ...]; rank r returns the sum over ranks of rows
    r*m:(r+1)*m.

    The case shape is the shape of one block (the output), [m, ...]. nccl-tests size: the input size, world
    blocks.
    """

    name = "reduce_scatter_sum"
    nccl_op = "reduce_scatter"
    functions = ("reduce_scatter",)

    def validate_case(self, case):
        _need_dim(case)

    def make_inputs(self, case, rank, world, seed):
        return {"x": rand(_blocks_shape(case, world), case.dtype, generator(seed), **int_range(case))}

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["reduce_scatter"](inputs["x"]), "reduce_scatter's return value")}

    def expected(self, case, world, inputs):
        m = int(case.shape[0])
        total = torch.stack([wide(i["x"]) for i in inputs]).sum(0)
        return [{"y": narrow(total[r * m:(r + 1) * m], case.dtype)} for r in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        block = _numel(case.shape)  # rank r's output is block r of every input, summed
        flats = [i["x"].reshape(-1) for i in inputs]
        out = []
        for r in range(world):
            idx = pick(r, "y", block) + r * block
            out.append({"y": narrow(torch.stack([wide(f[idx]) for f in flats]).sum(0), case.dtype)})
        return out

    def size_case(self, perf, size_bytes, world):
        return _per_rank_case(perf, size_bytes, world, f"bench-{size_bytes}")

    def metric_bytes(self, case, world):
        return world * _numel(case.shape) * _elem(case.dtype)


@register
class Broadcast(GoldenOp):
    """`broadcast(x, root) -> y`: every rank returns the root's x.

    `params.root` picks the root; a negative value counts from the end (-1 = the last rank), and a root
    outside the world skips the case for that world size. Off the root, x has the right shape and dtype but
    holds NaN (floats), zeros (integers) or False (bool), so nothing about the data leaks to other ranks.
    """

    name = "broadcast"
    nccl_op = "broadcast"
    functions = ("broadcast",)

    @staticmethod
    def root(case, world: int) -> int:
        root = int(case.params.get("root", 0))
        return root + world if root < 0 else root

    def validate_case(self, case):
        root = case.params.get("root", 0)
        if type(root) is not int:
            raise ValueError(f"params.root must be an int, got {root!r}")

    def supports_world(self, world, case):
        return 0 <= self.root(case, world) < world

    def make_inputs(self, case, rank, world, seed):
        if rank == self.root(case, world):
            return {"x": rand(case.shape, case.dtype, generator(seed), **int_range(case))}
        dt = to_dtype(case.dtype)
        fill = float("nan") if dt.is_floating_point else 0
        return {"x": torch.full([int(s) for s in case.shape], fill, dtype=dt)}

    def call(self, fns, inputs, case, rank, world):
        y = fns["broadcast"](inputs["x"], self.root(case, world))
        return {"y": expect_tensor(y, "broadcast's return value")}

    def expected(self, case, world, inputs):
        y = inputs[self.root(case, world)]["x"].clone()
        return [{"y": y} for _ in range(world)]


@register
class AllToAll(GoldenOp):
    """`all_to_all(x) -> y`: x and y have shape [world * m, ...]; block j of rank r's y (rows j*m:(j+1)*m) is
    block r of rank j's x.

    The case shape is the shape of one block, [m, ...]. nccl-tests size: the whole x, world blocks.
    """

    name = "all_to_all"
    nccl_op = "alltoall"
    functions = ("all_to_all",)

    def validate_case(self, case):
        _need_dim(case)

    def make_inputs(self, case, rank, world, seed):
        return {"x": rand(_blocks_shape(case, world), case.dtype, generator(seed), **int_range(case))}

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["all_to_all"](inputs["x"]), "all_to_all's return value")}

    def expected(self, case, world, inputs):
        m = int(case.shape[0])
        return [{"y": torch.cat([inputs[j]["x"][r * m:(r + 1) * m] for j in range(world)], dim=0)}
                for r in range(world)]

    def size_case(self, perf, size_bytes, world):
        return _per_rank_case(perf, size_bytes, world, f"bench-{size_bytes}")

    def metric_bytes(self, case, world):
        return world * _numel(case.shape) * _elem(case.dtype)
