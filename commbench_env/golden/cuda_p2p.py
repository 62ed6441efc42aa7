"""Golden semantics of the second wave of point-to-point CUDA tasks (issue #23).

- `ring_recv_add`: rank r returns x of its left neighbour plus its own x (p2p/put_with_signal: the payload is put
  into the receiver, which must wait for it before it can add it);
- `strided_pack_shift`: rank r returns the packed sub-matrix that its left neighbour cut out of its own strided
  input (p2p/strided_pack_put).

The ring shifts with other protocols (p2p/ll128_ring_shift, p2p/credit_ring_buffer) reuse `ring_shift`.
"""

from __future__ import annotations

import math

import torch

from . import register
from .base import GoldenOp, elem_size as _elem, expect_tensor, generator, int_param, rand

FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")


@register
class RingRecvAdd(GoldenOp):
    """`ring_recv_add(x) -> y`: y on rank r is x of rank (r - 1) mod world plus x of rank r, element-wise.

    Floating-point dtypes only. The expected sum is exact (float64); the candidate adds in at least float32 and
    rounds once to the dtype, which the dtype's tolerance covers. nccl-tests size: the bytes of one x (what each
    rank puts into its right neighbour)."""

    name = "ring_recv_add"
    nccl_op = "sendrecv"
    functions = ("recv_add",)

    def validate_case(self, case):
        if case.dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype must be one of {FLOAT_DTYPES} (the receiver adds), got {case.dtype!r}")
        if not case.shape or any(d < 1 for d in case.shape):
            raise ValueError("shape must have at least one dimension, all >= 1")

    def make_inputs(self, case, rank, world, seed):
        return {"x": rand(case.shape, case.dtype, generator(seed))}

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["recv_add"](inputs["x"]), "recv_add's return value")}

    def expected(self, case, world, inputs):
        return [{"y": inputs[(r - 1) % world]["x"].to(torch.float64) + inputs[r]["x"].to(torch.float64)}
                for r in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        numel = math.prod(case.shape)
        flats = [i["x"].reshape(-1) for i in inputs]
        out = []
        for r in range(world):
            idx = pick(r, "y", numel)
            out.append({"y": flats[(r - 1) % world][idx].to(torch.float64) + flats[r][idx].to(torch.float64)})
        return out


@register
class StridedPackShift(GoldenOp):
    """`strided_pack(x) -> y`: y on rank r is the sub-matrix x[row0 : row0 + rows, col0 : col0 + cols] of rank
    (r - 1) mod world, packed row-major into `rows * cols` contiguous elements.

    x is the case's 2-D shape [H, W], row-major; params row0, col0, rows, cols and stride (= W, the elements from
    one row to the next, passed so that a kernel need not derive it) are the same on every rank, and the region
    must fit inside x. A copy: bit-exact. nccl-tests size: the packed bytes. The benchmark case (`size_case`)
    keeps perf.params' cols, stride, row0 and col0 and takes as many rows as the size needs."""

    name = "strided_pack_shift"
    nccl_op = "sendrecv"
    functions = ("strided_pack",)
    PARAMS = ("row0", "col0", "rows", "cols", "stride")

    @staticmethod
    def region(case) -> tuple[int, int, int, int]:
        return (int_param(case, "row0", 0, 0), int_param(case, "col0", 0, 0), int_param(case, "rows", None, 1),
                int_param(case, "cols", None, 1))

    def validate_case(self, case):
        unknown = set(case.params) - set(self.PARAMS)
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}")
        if len(case.shape) != 2 or case.shape[0] < 1 or case.shape[1] < 1:
            raise ValueError("shape must be [H, W] with H, W >= 1")
        row0, col0, rows, cols = self.region(case)
        h, w = case.shape
        if int_param(case, "stride", None, 1) != w:
            raise ValueError(f"params.stride must be W = {w} (the row pitch of x in elements)")
        if row0 + rows > h:
            raise ValueError(f"rows {row0}..{row0 + rows - 1} do not fit in H = {h}")
        if col0 + cols > w:
            raise ValueError(f"columns {col0}..{col0 + cols - 1} do not fit in W = {w}")

    def make_inputs(self, case, rank, world, seed):
        return {"x": rand(case.shape, case.dtype, generator(seed))}

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["strided_pack"](inputs["x"]), "strided_pack's return value")}

    def expected(self, case, world, inputs):
        row0, col0, rows, cols = self.region(case)
        return [{"y": inputs[(r - 1) % world]["x"][row0:row0 + rows, col0:col0 + cols].contiguous().clone()}
                for r in range(world)]

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        p = dict(perf.params)
        cols = int(p.get("cols", 1000))
        stride = int(p.get("stride", cols))
        row0, col0 = int(p.get("row0", 0)), int(p.get("col0", 0))
        if col0 + cols > stride:
            raise ValueError(f"performance.params: col0 + cols = {col0 + cols} exceeds stride {stride}")
        rows = max(1, size_bytes // (cols * _elem(perf.dtype)))
        case = CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[row0 + rows + 1, stride], dtype=perf.dtype,
                        params={"row0": row0, "col0": col0, "rows": rows, "cols": cols, "stride": stride})
        self.validate_case(case)
        return case

    def metric_bytes(self, case, world):
        _, _, rows, cols = self.region(case)
        return rows * cols * _elem(case.dtype)
