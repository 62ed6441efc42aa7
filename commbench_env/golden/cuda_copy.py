"""Copies on one GPU whose ends sit at arbitrary offsets, and copies that stage data through shared memory.

- `offset_copy`: out[dst_offset : dst_offset + length] = in[src_offset : src_offset + length], every other element
  of out untouched (it keeps the judge's fill, all bytes 0xFF). The offsets move both ends of the copy off any
  alignment, independently of each other.
- `row_rms_scale`: a per-row reduction feeding a scaled copy (the rows' RMS normalisation without a weight),
  y[i, :] = x[i, :] * rsqrt(mean(x[i, :]^2) + eps), with the per-row factor as a second output.
"""

from __future__ import annotations

import math

import torch

from . import register
from .base import (GoldenOp, elem_size as _elem, expect_tensor, generator, int_param, narrow, num_param, rand, to_dtype,
                   wide)

_COPY_DTYPES = ("uint8", "int32", "int64")
# values never equal the fill (-1 / 0xFF): an element left unwritten inside the window always shows
_COPY_HIGH = {"uint8": 255, "int32": (1 << 31) - 1, "int64": 1 << 62}


@register
class OffsetCopy(GoldenOp):
    """`offset_copy`: y (out_count = dst_offset + length + dst_pad elements) is all -1 (0xFF bytes) except
    y[dst_offset : dst_offset + length] = x[src_offset : src_offset + length]; x has `shape` elements (flattened).

    params: src_offset, dst_offset, length (elements, length >= 0, src_offset + length <= numel(x)), dst_pad
    (elements of y after the window, default 0). Integer dtypes only: the untouched elements are compared exactly
    with the judge's fill, and the data never equals it. nccl-tests size: length * element size.
    """

    name = "offset_copy"
    nccl_op = None
    functions = ("offset_copy",)
    PARAMS = ("src_offset", "dst_offset", "length", "dst_pad", "src_pad")

    def _p(self, case):
        a = int_param(case, "src_offset", 0, 0)
        b = int_param(case, "dst_offset", 0, 0)
        n = int_param(case, "length", None, 0)
        pad = int_param(case, "dst_pad", 0, 0)
        return a, b, n, pad

    def validate_case(self, case):
        if case.dtype not in _COPY_DTYPES:
            raise ValueError(f"dtype must be one of {_COPY_DTYPES} (the untouched elements are checked bit-exactly)")
        unknown = set(case.params) - set(self.PARAMS)
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}")
        if "length" not in case.params:
            raise ValueError("params.length is required")
        if "src_pad" in case.params:
            raise ValueError("params.src_pad is for [performance] params only")
        a, _, n, _ = self._p(case)
        count = math.prod(case.shape) if case.shape else 1
        if count < 1:
            raise ValueError("the input needs at least one element")
        if a + n > count:
            raise ValueError(f"src_offset + length = {a + n} exceeds the input's {count} elements")

    def make_inputs(self, case, rank, world, seed):
        return {"x": rand(case.shape, case.dtype, generator(seed), low=0, high=_COPY_HIGH[case.dtype])}

    def call(self, fns, inputs, case, rank, world):
        a, b, n, pad = self._p(case)
        return {"y": expect_tensor(fns["offset_copy"](inputs["x"], a, b, n, pad), "offset_copy's return value")}

    def expected(self, case, world, inputs):
        a, b, n, pad = self._p(case)
        out = []
        for r in range(world):
            x = inputs[r]["x"].reshape(-1)
            y = torch.full((b + n + pad,), -1, dtype=x.dtype)
            y[b:b + n] = x[a:a + n]
            out.append({"y": y})
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        p = dict(perf.params)
        n = max(1, size_bytes // _elem(perf.dtype))
        a, src_pad = int(p.pop("src_offset", 0)), int(p.pop("src_pad", 0))
        params = {"src_offset": a, "dst_offset": int(p.pop("dst_offset", 0)), "length": n,
                  "dst_pad": int(p.pop("dst_pad", 0))}
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[a + n + src_pad], dtype=perf.dtype,
                        params=params)

    def metric_bytes(self, case, world):
        return int(case.params["length"]) * _elem(case.dtype)


@register
class RowRmsScale(GoldenOp):
    """`row_rms_scale`: x [rows, d] -> y [rows, d] and rstd [rows], with, in float64,
    rstd[i] = 1 / sqrt(mean_j x[i, j]^2 + eps) and y[i, j] = x[i, j] * rstd[i]; eps = params.eps_e9 * 1e-9.

    params: eps_e9 (required: the card passes it to the kernel), scale (the inputs' magnitude, default 1; each row
    is further scaled by exp(N(0, 1)), so rows differ by orders of magnitude). Both outputs are compared with the
    card's tolerance of the data's dtype. nccl-tests size: the bytes of x.
    """

    name = "row_rms_scale"
    nccl_op = None
    functions = ("row_rms_scale",)

    def validate_case(self, case):
        if len(case.shape) != 2 or case.shape[0] < 1 or case.shape[1] < 1:
            raise ValueError("shape must be [rows, d] with rows, d >= 1")
        if case.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError("dtype must be float32, bfloat16 or float16")
        unknown = set(case.params) - {"eps_e9", "scale"}
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}")
        if "eps_e9" not in case.params:
            raise ValueError("params.eps_e9 is required (eps in units of 1e-9)")
        int_param(case, "eps_e9", None, 1, 10 ** 9)
        num_param(case, "scale", 1.0, 1e-30, 1e30)

    def make_inputs(self, case, rank, world, seed):
        s = num_param(case, "scale", 1.0)
        gen = generator(seed)
        x = rand(case.shape, "float32", gen)
        x = x * (s * torch.exp(rand([case.shape[0], 1], "float32", gen)))
        return {"x": x.to(to_dtype(case.dtype))}

    def call(self, fns, inputs, case, rank, world):
        y, rstd = fns["row_rms_scale"](inputs["x"], int_param(case, "eps_e9") * 1e-9)
        return {"y": expect_tensor(y, "row_rms_scale's y"), "rstd": expect_tensor(rstd, "row_rms_scale's rstd")}

    def expected(self, case, world, inputs):
        eps = int_param(case, "eps_e9") * 1e-9
        out = []
        for r in range(world):
            x = wide(inputs[r]["x"])
            rstd = torch.rsqrt((x * x).mean(dim=1) + eps)
            out.append({"y": narrow(x * rstd[:, None], case.dtype), "rstd": narrow(rstd, case.dtype)})
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        p = dict(perf.params)
        d = int(p.pop("hidden", 4096))
        rows = max(1, size_bytes // (d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[rows, d], dtype=perf.dtype, params=p)
