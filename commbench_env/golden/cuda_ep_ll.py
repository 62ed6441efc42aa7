"""Golden semantics of the low-latency expert-parallel CUDA tasks of the second wave (issue #23): cuda_ep_ll.

- `ep_low_latency_combine_slots`: the pair of `ep_low_latency_dispatch_slots` (cuda_ep_fusion.py). The expert
  outputs sit on the experts' ranks in the fixed per-(local expert, source rank) slots that the low-latency
  dispatch produced, with the dispatch's recv_count / recv_src_idx as inputs; every source rank gets back, per
  token, the top-k-weighted sum of its experts' outputs.

(ep/expert_migration_cuda reuses moe.py's `expert_rebalance`: its semantics are the same in CUDA.)
"""

from __future__ import annotations

import torch

from . import register
from .base import GoldenOp, elem_size as _elem, generator, narrow, rand, to_dtype, wide
from .ep_patterns import _rank_tokens, _validate_route
from .moe import _cuda_only, _int_param, _shared_seed, _topk_route

#: the prompt's limits: max_tokens, experts per rank (E = world * epr at most 1024 at world 8), top-k
LL_MAX_TOKENS = 1024
LL_MAX_EPR = 128


@register
class EpLowLatencyCombineSlots(GoldenOp):
    """`low_latency_combine` (cuda): weighted top-k combine from fixed per-(local expert, source) slots.

    case.shape = [M, d]: M = max_tokens, d = hidden size; a float dtype; params: experts_per_rank (epr) and topk
    (required), the routing params of moe.py's `_topk_route` (skew, routing_seed, drop, target_rank, idle_rank),
    min_tokens (each rank's T_s uniform in [min_tokens, M]; all M without it) and empty_rank (that rank has no
    tokens).

    The routing is public: every rank (and the coordinator) derives every rank's T_s and topk_idx_s [T_s, k] from
    the case alone (`routing`), because an expert's rank must know where its slot rows came from. Inputs of rank
    r, with W = world and E = W * epr:
    - expert_y [epr, W * M, d] (the case dtype): slot (l, s) = rows [s * M, (s + 1) * M) of expert_y[l]; its first
      slot_count[l, s] rows are the outputs of local expert l (global r * epr + l) for the tokens of rank s routed
      to it, in increasing token index (the layout of the low-latency dispatch); drawn from r's own seed. The rows
      past the count are NaN (they belong to no token).
    - slot_count int64 [epr, W], slot_src_idx int64 [epr, W * M]: the dispatch's recv_count and recv_src_idx
      (each valid row's token index on its source rank, -1 past the count).
    - topk_idx int64 [T_r, k]: r's own routing (distinct experts per row, -1 masked); topk_weights float32
      [T_r, k]: uniform in [0, 1) from r's own seed, NaN at masked entries (which must not count).
    Output of rank s: combined_x [T_s, d]: row i = sum over j with topk_idx_s[i, j] = e >= 0 of
    topk_weights_s[i, j] * (the row of token i in slot (e % epr, s) of rank e // epr); zero for a token routed
    nowhere. Computed in float64 from each source's topk_idx (a row's place in its slot is recounted from the
    routing, independently of the slot_src_idx inputs). The routing (and with it T_s and every output's shape) is
    the same in every call of a case; expert_y and topk_weights are fresh. nccl-tests size: the bytes of M tokens
    of d elements (latency metric).
    """

    name = "ep_low_latency_combine_slots"
    nccl_op = None
    functions = ("low_latency_combine",)
    extra = ("min_tokens", "empty_rank")

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)

    def validate_case(self, case):
        if len(case.shape) != 2 or case.shape[0] < 1 or case.shape[1] < 1:
            raise ValueError(f"shape must be [max_tokens, hidden] with both >= 1, got {case.shape}")
        if int(case.shape[0]) > LL_MAX_TOKENS:
            raise ValueError(f"max_tokens (shape[0]) must be <= {LL_MAX_TOKENS}, got {case.shape[0]}")
        if not to_dtype(case.dtype).is_floating_point or case.dtype == "float64":
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {case.dtype}")
        _validate_route(case, self.extra)
        if int(case.params["experts_per_rank"]) > LL_MAX_EPR:
            raise ValueError(f"experts_per_rank must be <= {LL_MAX_EPR} (at most 1024 experts at world 8)")
        _int_param(case, "min_tokens", low=0)
        _int_param(case, "empty_rank", low=0)

    def supports_world(self, world, case):
        return world >= 2 or case.params.get("idle_rank") is None

    # ---- the public routing and the slot layout it implies -------------------------------------------------------
    def routing(self, case, world: int) -> list[torch.Tensor]:
        """Every rank's topk_idx [T_s, k] (T_s included), from public case data alone."""
        m = int(case.shape[0])
        epr, k = int(case.params["experts_per_rank"]), int(case.params["topk"])
        base = (0xC0B2, int(case.params.get("routing_seed", 0)), world, m, k, epr)
        routes = []
        for s in range(world):
            g = generator(_shared_seed(*base, s))
            routes.append(_topk_route(case, world, _rank_tokens(case, s, world, g, m), g))
        return routes

    @staticmethod
    def slot_layout(routes: list[torch.Tensor], r: int, epr: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank r's slot_count [epr, W] and slot_src_idx [epr, W * M] (int64), as the low-latency dispatch writes
        its recv_count and recv_src_idx."""
        world = len(routes)
        count = torch.zeros((epr, world), dtype=torch.int64)
        src = torch.full((epr, world * m), -1, dtype=torch.int64)
        for l in range(epr):
            for s, ids in enumerate(routes):
                idx = (ids == r * epr + l).any(1).nonzero()[:, 0]
                n = int(idx.numel())
                count[l, s] = n
                src[l, s * m:s * m + n] = idx
        return count, src

    # ---- rank side -------------------------------------------------------------------------------------------------
    def make_inputs(self, case, rank, world, seed):
        m, d = (int(s) for s in case.shape)
        epr, k = int(case.params["experts_per_rank"]), int(case.params["topk"])
        routes = self.routing(case, world)
        count, src = self.slot_layout(routes, rank, epr, m)
        gen = generator(seed)
        y = torch.full((epr, world * m, d), float("nan"), dtype=to_dtype(case.dtype))
        valid = src >= 0
        y[valid] = rand([int(valid.sum()), d], case.dtype, gen)
        ids = routes[rank]
        w = torch.rand((int(ids.shape[0]), k), generator=gen, dtype=torch.float32)
        w[ids < 0] = float("nan")
        return {"expert_y": y, "slot_src_idx": src, "slot_count": count, "topk_idx": ids, "topk_weights": w}

    # ---- coordinator side ------------------------------------------------------------------------------------------
    @staticmethod
    def entry_rows(ids: torch.Tensor, epr: int, n_exp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per entry (i, j) of one source's topk_idx: its row in its slot (the number of tokens i' < i of the
        source with the same expert: from the routing, not from the slot_src_idx inputs) and whether it is
        valid."""
        valid = ids >= 0
        e = torch.where(valid, ids, 0)
        hit = torch.zeros((int(ids.shape[0]), n_exp + 1), dtype=torch.int64)
        hit.scatter_(1, torch.where(valid, ids, n_exp), 1)
        before = torch.cumsum(hit, 0) - hit  # [T, E + 1]: earlier tokens with that expert
        return torch.gather(before, 1, e) * valid, valid

    def expected(self, case, world, inputs):
        m, d = (int(s) for s in case.shape)
        epr = int(case.params["experts_per_rank"])
        out = []
        for s in range(world):
            ids, w = inputs[s]["topk_idx"], wide(inputs[s]["topk_weights"])
            pos, valid = self.entry_rows(ids, epr, world * epr)
            y = torch.zeros((int(ids.shape[0]), d), dtype=torch.float64)
            tok = torch.arange(int(ids.shape[0]))[:, None].expand_as(ids)
            for r in range(world):
                sel = valid & (ids // epr == r)
                if not bool(sel.any()):
                    continue
                rows = wide(inputs[r]["expert_y"][ids[sel] % epr, s * m + pos[sel]])
                y.index_add_(0, tok[sel], rows * w[sel][:, None])
            out.append({"combined_x": narrow(y, case.dtype)})
        return out

    def expected_samples(self, case, world, inputs, pick):
        """Only the sampled elements: per sampled (token, column), the k weighted values of that column."""
        m, d = (int(s) for s in case.shape)
        epr = int(case.params["experts_per_rank"])
        out = []
        for s in range(world):
            ids, w = inputs[s]["topk_idx"], wide(inputs[s]["topk_weights"])
            idx = pick(s, "combined_x", int(ids.shape[0]) * d)
            row, col = idx // d, idx % d
            pos, valid = self.entry_rows(ids, epr, world * epr)
            y = torch.zeros(int(idx.numel()), dtype=torch.float64)
            for j in range(int(ids.shape[1])):
                e, ok, p = ids[row, j], valid[row, j], pos[row, j]
                for r in range(world):
                    sel = ok & (e // epr == r)
                    if bool(sel.any()):
                        v = wide(inputs[r]["expert_y"][e[sel] % epr, s * m + p[sel], col[sel]])
                        y[sel] += w[row[sel], j] * v
            out.append({"combined_x": narrow(y, case.dtype)})
        return out

    # ---- benchmark -------------------------------------------------------------------------------------------------
    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = dict(perf.params)
        d = int(params.pop("hidden", 7168))
        params.setdefault("experts_per_rank", 4)
        params.setdefault("topk", 8)
        m = min(LL_MAX_TOKENS, max(1, size_bytes // (d * _elem(perf.dtype))))
        params["min_tokens"] = m  # every rank full: the decode batch at its largest
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[m, d], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * int(case.shape[1]) * _elem(case.dtype)
