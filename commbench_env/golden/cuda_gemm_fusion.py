"""Golden semantics of the kernel-level GEMM + communication tasks of the second CUDA wave (issue #23):
cuda_gemm_fusion.

Both ops keep the semantics of the torch fusion tasks' ops in golden/fusion.py (inputs, expected outputs, sampled
checks of timed calls, the benchmark's size mapping, the FLOP count) and add only what a `cuda` task's cb_args
needs and what the tensor-core tasks promise:
- the inner dimension k as `params.k` (equal to shape[1]; cb_args.params[0]), so that a kernel can tell m, k and n
  apart from its element counts (the benchmark's cases carry it too);
- 16-bit data only (bfloat16, float16: tensor-core inputs);
- limits that the prompts state (see MAX_ROWS and friends) and that the cards' scratch and flag sizes cover.

- `allgather_gemm_tiles`: AllGatherMatmul (rank r: x_r [m, k], w_r [k, n] -> cat(x_0 .. x_{world-1}) @ w_r).
- `gemm_reduce_scatter_tiles`: MatmulReduceScatter (rank r: a_r [world * m, k], b_r [k, n] -> rows r*m ..
  (r+1)*m - 1 of sum_s a_s @ b_s).
"""

from __future__ import annotations

from . import register
from .base import int_param
from .fusion import AllGatherMatmul, MatmulReduceScatter
from .moe import _cuda_only

#: the dtypes the tensor-core prompts promise
GEMM_DTYPES = ("bfloat16", "float16")
#: the largest m, k and n (each) the prompts promise: products and offsets of three of them fit in int64, and
#: any one of them in int32
GEMM_MAX_DIM = 1 << 16


def _check_cuda_gemm_case(case) -> None:
    if case.dtype not in GEMM_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(GEMM_DTYPES)} (tensor-core inputs), got {case.dtype}")
    unknown = set(case.params) - {"k"}
    if unknown:
        raise ValueError(f"unknown params {sorted(unknown)} (known: k, which must equal shape[1])")
    k = int_param(case, "k", low=1)
    if k != int(case.shape[1]):
        raise ValueError(f"params.k must equal shape[1] (the inner dimension), got k = {k} for shape {case.shape}")
    big = [int(s) for s in case.shape if int(s) > GEMM_MAX_DIM]
    if big:
        raise ValueError(f"every size of shape must be <= {GEMM_MAX_DIM}, got {case.shape}")


def _with_k(case):
    """The benchmark case of the torch op with params.k set from its shape (the torch op takes k out of params)."""
    from ..cards import CaseSpec

    return CaseSpec(name=case.name, visible=False, shape=list(case.shape), dtype=case.dtype,
                    params={**case.params, "k": int(case.shape[1])})


@register
class AllGatherGemmTiles(AllGatherMatmul):
    """`allgather_gemm` (cuda): the all-gather of row blocks fused with a GEMM of the gathered rows.

    case.shape = [m, k, n], params.k = k. Rank r holds x_r [m, k] and w_r [k, n] and returns y_r = X @ w_r, shape
    [world * m, n], with X = cat(x_0, ..., x_{world-1}) along rows (row block s of y_r is x_s @ w_r). The
    nccl-tests size is the gathered X, world * m * k elements; flops 2 * world * m * k * n per rank.
    """

    name = "allgather_gemm_tiles"
    functions = ("allgather_gemm",)

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)

    def validate_case(self, case):
        super().validate_case(case)
        _check_cuda_gemm_case(case)

    def size_case(self, perf, size_bytes, world):
        return _with_k(super().size_case(perf, size_bytes, world))


@register
class GemmReduceScatterTiles(MatmulReduceScatter):
    """`gemm_reduce_scatter` (cuda): a row-parallel GEMM whose summed product is reduce-scattered by row blocks.

    case.shape = [m, k, n], params.k = k. Rank r holds a_r [world * m, k] and b_r [k, n]; with
    P = sum_s a_s @ b_s ([world * m, n]) it returns rows r*m .. (r+1)*m - 1 of P, shape [m, n]. The nccl-tests size
    is one rank's partial product, world * m * n elements; flops 2 * world * m * k * n per rank.
    """

    name = "gemm_reduce_scatter_tiles"
    functions = ("gemm_reduce_scatter",)

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)

    def validate_case(self, case):
        super().validate_case(case)
        _check_cuda_gemm_case(case)

    def size_case(self, perf, size_bytes, world):
        return _with_k(super().size_case(perf, size_bytes, world))
