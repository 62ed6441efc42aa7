"""Golden semantics of the MoE dispatch fused with the experts' grouped GEMM (issue #23): cuda_moe_gemm.

- `moe_dispatch_grouped_gemm`: every rank's tokens reach the ranks of their top-k experts, and each rank returns,
  per local expert, the products of the tokens routed to it with that expert's weight, in a stated order.
"""

from __future__ import annotations

import torch

from . import register
from .base import GoldenOp, elem_size as _elem, generator, int_param, narrow, rand, to_dtype, wide
from .moe import _cuda_only, _shared_seed, _topk_route, _validate_topk_routing

#: tensor-core input dtypes
DTYPES = ("bfloat16", "float16")
#: the limits the prompt states: tokens per rank, hidden and ffn sizes (multiples of DIM_MULTIPLE), experts per
#: rank (a rank's local experts fit one 32-bit mask) and k
MAX_TOKENS = 8192
MAX_DIM = 8192
DIM_MULTIPLE = 64
MAX_EPR = 32
MAX_K = 32
_ROUTING_TAG = 0x6E44_6D6D  # keeps this op's shared routing apart from other ops' streams


@register
class MoeDispatchGroupedGemm(GoldenOp):
    """`dispatch_gemm` (cuda): MoE dispatch feeding each local expert's GEMM on the receiving rank.

    case.shape = [T, d, f] (tokens per rank, hidden size, expert output size), dtype bfloat16 or float16; params
    experts_per_rank (epr, <= 32), topk and the routing params of moe._topk_route. E = world * epr experts; expert e
    lives on rank e // epr as its local expert e % epr. The routing is shared: every rank and the coordinator derive
    all ranks' topk_idx from public case data, so that every rank's output has the same shape in every call of a
    case (the benchmark's outputs are allocated once); x and w are private and fresh every call.
    Inputs of rank s: x [T, d] (own seed), topk_idx [T, topk] int64 (distinct expert ids per row, or -1),
    w [epr, d, f] (own seed): the weights of its local experts.
    Output of rank r: y [n_r, f], n_r = the (token, expert) entries routed to r, i.e. the pairs (s, i, e) with e a
    local expert of r in topk_idx_s[i]. Rows are ordered by local expert e, then source rank s, then token index i;
    the row of (s, i, e) is x_s[i] @ w_r[e], computed here in float64.
    nccl-tests size: the bytes of one rank's x. flops: 2 * d * f per entry, averaged over the ranks.
    """

    name = "moe_dispatch_grouped_gemm"
    nccl_op = None
    functions = ("dispatch_gemm",)

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)

    def validate_case(self, case):
        if len(case.shape) != 3:
            raise ValueError(f"shape must be [tokens, d, f], got {case.shape}")
        t, d, f = (int(s) for s in case.shape)
        if not 1 <= t <= MAX_TOKENS:
            raise ValueError(f"tokens (shape[0]) must be in [1, {MAX_TOKENS}], got {t}")
        for name, v in (("d", d), ("f", f)):
            if v < DIM_MULTIPLE or v > MAX_DIM or v % DIM_MULTIPLE:
                raise ValueError(f"{name} must be a multiple of {DIM_MULTIPLE} in [{DIM_MULTIPLE}, {MAX_DIM}], got {v}")
        if case.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (tensor-core inputs), got {case.dtype}")
        _validate_topk_routing(case)
        int_param(case, "experts_per_rank", low=1, high=MAX_EPR)
        int_param(case, "topk", low=1, high=MAX_K)

    # ---- inputs ----------------------------------------------------------------------------------------
    def routing(self, case, world: int) -> list[torch.Tensor]:
        """Every rank's topk_idx [T, topk] int64, from public case data alone."""
        t = int(case.shape[0])
        epr, k = int(case.params["experts_per_rank"]), int(case.params["topk"])
        base = (_ROUTING_TAG, int(case.params.get("routing_seed", 0)), world, t, k, epr)
        return [_topk_route(case, world, t, generator(_shared_seed(*base, s))) for s in range(world)]

    def make_inputs(self, case, rank, world, seed):
        t, d, f = (int(s) for s in case.shape)
        epr = int(case.params["experts_per_rank"])
        gen = generator(seed)
        x = rand([t, d], case.dtype, gen)
        # scaled so that the products stay near 1: float16 data cannot hold sums of d unit-variance terms
        w = (rand([epr, d, f], "float32", gen) * d ** -0.5).to(to_dtype(case.dtype))
        return {"x": x, "topk_idx": self.routing(case, world)[rank], "w": w}

    @staticmethod
    def layout(routes: list[torch.Tensor], epr: int, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rows of rank `rank`'s y: (source rank, token index, local expert) per row, in the output order."""
        srcs, toks, exps = [], [], []
        for e in range(epr):
            for s, ids in enumerate(routes):
                hit = (ids == rank * epr + e).any(1).nonzero().flatten()
                srcs.append(torch.full((int(hit.numel()),), s, dtype=torch.int64))
                toks.append(hit)
                exps.append(torch.full((int(hit.numel()),), e, dtype=torch.int64))
        return torch.cat(srcs), torch.cat(toks), torch.cat(exps)

    # ---- checks ----------------------------------------------------------------------------------------
    def expected(self, case, world, inputs):
        f = int(case.shape[2])
        epr = int(case.params["experts_per_rank"])
        routes = [i["topk_idx"] for i in inputs]
        out = []
        for r in range(world):
            src, tok, exp = self.layout(routes, epr, r)
            y = torch.empty((int(src.numel()), f), dtype=torch.float64)
            w = inputs[r]["w"]
            for e in range(epr):
                sel = (exp == e).nonzero().flatten()
                if sel.numel() == 0:
                    continue
                rows = torch.cat([wide(inputs[s]["x"][tok[sel][src[sel] == s]]) for s in range(world)])
                y[sel] = rows @ wide(w[e])
            out.append({"y": narrow(y, case.dtype)})
        return out

    def expected_samples(self, case, world, inputs, pick):
        f = int(case.shape[2])
        epr = int(case.params["experts_per_rank"])
        routes = [i["topk_idx"] for i in inputs]
        xs = torch.stack([i["x"] for i in inputs])  # [world, T, d]
        out = []
        for r in range(world):
            src, tok, exp = self.layout(routes, epr, r)
            idx = pick(r, "y", int(src.numel()) * f)
            row, col = idx // f, idx % f
            a = wide(xs[src[row], tok[row]])  # [S, d]
            b = wide(inputs[r]["w"][exp[row], :, col])  # [S, d]
            out.append({"y": narrow((a * b).sum(1), case.dtype)})
        return out

    # ---- benchmark -------------------------------------------------------------------------------------
    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = dict(perf.params)
        d, f = int(params.pop("hidden", 2048)), int(params.pop("ffn", 1024))
        params.setdefault("experts_per_rank", 8)
        params.setdefault("topk", 4)
        t = max(1, min(MAX_TOKENS, size_bytes // (d * _elem(perf.dtype))))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t, d, f], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * int(case.shape[1]) * _elem(case.dtype)

    def flops(self, case, world):
        _, d, f = (int(s) for s in case.shape)
        entries = sum(int((ids >= 0).sum()) for ids in self.routing(case, world))
        return 2.0 * d * f * entries / max(1, world)
