"""Golden semantics of kernel-level ep and fusion tasks of the second CUDA wave (issue #23): cuda_ep_fusion.

- `qk_norm_across_ranks`: the RMSNorm of a tensor-parallel attention block's q and k projections over ALL heads of
  a token, when the heads are sharded across ranks (each rank normalises its own slice with statistics that span
  every rank).
- `ep_low_latency_dispatch_slots`: the low-latency MoE dispatch into fixed per-(local expert, source rank) slots of
  `ep_low_latency_dispatch`, as a kernel-level op whose padding is defined (zero rows, -1 indices), so that every
  output element is checked, in timed calls too.
"""

from __future__ import annotations

import torch

from . import register
from .base import GoldenOp, elem_size as _elem, generator, int_param, narrow, rand, to_dtype, wide
from .ep_patterns import EpLowLatencyDispatch
from .moe import _cuda_only

#: the widest row (Dq + Dk elements) the qk-norm prompt promises
QK_MAX_ROW = 16384
#: the most tokens per rank the qk-norm prompt promises
QK_MAX_TOKENS = 16384
#: the low-latency dispatch prompt's limits: max_tokens, experts per rank
LL_MAX_TOKENS = 1024
LL_MAX_EPR = 128


# ---- RMSNorm of q and k over heads sharded across ranks -----------------------------------------------------------

@register
class QkNormAcrossRanks(GoldenOp):
    """`qk_norm` (cuda): RMSNorm of q and of k over all heads of each token, the heads sharded across ranks.

    case.shape = [T, Dq, Dk]: T tokens; every rank holds Dq columns of q (its heads, Hq / world * head_dim) and Dk
    columns of k of every token. Rank r's inputs (all from its own seed): q_r [T, Dq], k_r [T, Dk] (normal values
    times a log-normal factor per (rank, token), so that one rank's sum of squares says little about the total),
    q_weight_r [Dq], k_weight_r [Dk] (its slices of the norm weights). With Sq[t] = sum over ranks r' of
    sum_j q_r'[t, j]^2 (and Sk likewise):

        q_out_r[t, j] = q_r[t, j] / sqrt(Sq[t] / (world * Dq) + eps) * q_weight_r[j]
        k_out_r[t, j] = k_r[t, j] / sqrt(Sk[t] / (world * Dk) + eps) * k_weight_r[j]

    eps = params.eps_e9 * 1e-9 (default 1000). nccl-tests size: the bytes of one rank's q and k, T * (Dq + Dk)
    elements. Limits: Dq + Dk <= QK_MAX_ROW, T <= QK_MAX_TOKENS.
    """

    name = "qk_norm_across_ranks"
    nccl_op = None
    functions = ("qk_norm",)

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)

    def validate_case(self, case):
        if len(case.shape) != 3 or any(int(s) < 1 for s in case.shape):
            raise ValueError(f"shape must be [tokens, q_width, k_width] with every size >= 1, got {case.shape}")
        t, dq, dk = (int(s) for s in case.shape)
        if dq + dk > QK_MAX_ROW:
            raise ValueError(f"q_width + k_width must be <= {QK_MAX_ROW}, got {dq + dk}")
        if t > QK_MAX_TOKENS:
            raise ValueError(f"tokens must be <= {QK_MAX_TOKENS}, got {t}")
        if not to_dtype(case.dtype).is_floating_point:
            raise ValueError(f"dtype must be a floating type, got {case.dtype}")
        unknown = set(case.params) - {"eps_e9"}
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)} (known: eps_e9)")
        int_param(case, "eps_e9", default=1000, low=1)

    @staticmethod
    def eps(case) -> float:
        return int(case.params.get("eps_e9", 1000)) * 1e-9

    def make_inputs(self, case, rank, world, seed):
        t, dq, dk = (int(s) for s in case.shape)
        gen = generator(seed)
        scale_q = torch.exp(torch.randn((t, 1), generator=gen, dtype=torch.float64))
        scale_k = torch.exp(torch.randn((t, 1), generator=gen, dtype=torch.float64))
        q = (wide(rand([t, dq], case.dtype, gen)) * scale_q).to(to_dtype(case.dtype))
        k = (wide(rand([t, dk], case.dtype, gen)) * scale_k).to(to_dtype(case.dtype))
        return {"q": q, "k": k, "q_weight": rand([dq], case.dtype, gen), "k_weight": rand([dk], case.dtype, gen)}

    def _normed(self, case, world, inputs, rank: int, rows) -> dict[str, torch.Tensor]:
        eps = self.eps(case)
        out = {}
        for name in ("q", "k"):
            width = int(inputs[rank][name].shape[1])
            total = sum((wide(i[name][rows]) ** 2).sum(-1, keepdim=True) for i in inputs)
            y = wide(inputs[rank][name][rows]) * torch.rsqrt(total / (world * width) + eps) \
                * wide(inputs[rank][name + "_weight"])
            out[name + "_out"] = narrow(y, case.dtype)
        return out

    def expected(self, case, world, inputs):
        return [self._normed(case, world, inputs, r, slice(None)) for r in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        """Only the tokens that hold a sampled position are normalised."""
        t, dq, dk = (int(s) for s in case.shape)
        out = []
        for r in range(world):
            vals = {}
            for name, width in (("k_out", dk), ("q_out", dq)):  # sorted name order, as the rank drew them
                idx = pick(r, name, t * width)
                rows, where = torch.unique(idx // width, return_inverse=True)
                vals[name] = self._normed(case, world, inputs, r, rows)[name][where, idx % width]
            out.append(vals)
        return out

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is one rank's q and k, T * (Dq + Dk) elements; Dq, Dk from perf params (4096, 1024)."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        dq, dk = int(params.pop("q_width", 4096)), int(params.pop("k_width", 1024))
        t = max(1, min(QK_MAX_TOKENS, size_bytes // ((dq + dk) * _elem(perf.dtype))))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t, dq, dk], dtype=perf.dtype,
                        params=params)

    def metric_bytes(self, case, world):
        t, dq, dk = (int(s) for s in case.shape)
        return t * (dq + dk) * _elem(case.dtype)


# ---- low-latency dispatch into fixed per-expert slots, padding defined ---------------------------------------------

@register
class EpLowLatencyDispatchSlots(EpLowLatencyDispatch):
    """`low_latency_dispatch` (cuda): `ep_low_latency_dispatch` with its padding defined.

    The layout is that of `ep_low_latency_dispatch` (case.shape = [M, d], each rank's T private with
    params.min_tokens; recv_x [epr, world * M, d], recv_count [epr, world] int64, recv_src_idx [epr, world * M]
    int64, the slot of (local expert l, source s) at rows [s * M, (s + 1) * M)), except that the rows of a slot past
    its count are part of the result: zero in recv_x and -1 in recv_src_idx. So the default comparison applies
    everywhere, and the sampled checks of timed calls (which compare against `expected` at random positions) are
    right too.
    """

    name = "ep_low_latency_dispatch_slots"

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)

    def validate_case(self, case):
        super().validate_case(case)
        if int(case.shape[0]) > LL_MAX_TOKENS:
            raise ValueError(f"max_tokens (shape[0]) must be <= {LL_MAX_TOKENS}, got {case.shape[0]}")
        if int(case.params["experts_per_rank"]) > LL_MAX_EPR:
            raise ValueError(f"experts_per_rank must be <= {LL_MAX_EPR} (at most 1024 experts at world 8)")

    verify = GoldenOp.verify  # every element, padding included (expected() has zero rows and -1 there)
