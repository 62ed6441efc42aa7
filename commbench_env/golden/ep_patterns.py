"""Golden semantics of the first task wave (issue #22): ep_patterns.

Expert-parallel patterns of the torch tasks beyond top-1 dispatch/combine: the globally consistent dispatch
layout, dispatch and combine with a per-expert capacity (deterministic dropping), the low-latency dispatch into
fixed-size per-expert slots, the two-stage (node / rail) dispatch, and a whole MoE layer forward with private
expert MLPs. The top-k routing, the row-bound secret expert transform and the param checks come from moe.py.
"""

from __future__ import annotations

import math

import torch

from . import register
from .base import CandidateError, GoldenOp, elem_size as _elem, expect_tensor, generator, narrow, rand, to_dtype, wide
from .compare import compare_tensor
from .moe import (MoeDispatchCombine, _int_param, _num_param, _owners, _rank_hits, _shared_seed, _topk_route,
                  _validate_topk_routing)


def _validate_route(case, extra: tuple[str, ...]) -> None:
    """The top-k routing params of moe.py (`_topk_route`), plus this op's own `extra` keys (checked by the op)."""
    base = {k: v for k, v in case.params.items() if k not in extra}
    _validate_topk_routing(case.model_copy(update={"params": base}))


def _results(value, names: tuple[str, ...], fn: str) -> dict[str, torch.Tensor]:
    """A candidate's tuple of tensors, by name; a CandidateError naming what is wrong otherwise."""
    if not isinstance(value, (tuple, list)) or len(value) != len(names):
        got = f"a {type(value).__name__}" + (f" of {len(value)}" if isinstance(value, (tuple, list)) else "")
        raise CandidateError(f"{fn} must return a tuple of {len(names)} tensors ({', '.join(names)}), got {got}")
    return {n: expect_tensor(v, f"{fn}'s {n}") for n, v in zip(names, value)}


def _rank_tokens(case, rank: int, world: int, gen: torch.Generator, cap: int) -> int:
    """Tokens of one rank: `cap`, or 0 on params.empty_rank, or uniform in [params.min_tokens, cap] (private)."""
    empty = case.params.get("empty_rank")
    if empty is not None and rank == int(empty) % world:
        return 0
    low = case.params.get("min_tokens")
    if low is None or int(low) >= cap:
        return cap
    return int(torch.randint(int(low), cap + 1, (1,), generator=gen))


def _expert_counts(ids: torch.Tensor, n_exp: int) -> torch.Tensor:
    """[E] int64: the entries of a [T, k] top-k table routed to each expert (-1 entries skipped)."""
    return torch.bincount(ids[ids >= 0], minlength=n_exp)


def _rows_of(ids: torch.Tensor, n_exp: int) -> torch.Tensor:
    """[T, E] bool: row i chose expert e (ids are distinct within a row)."""
    hit = torch.zeros((int(ids.shape[0]), n_exp + 1), dtype=torch.bool)
    hit.scatter_(1, torch.where(ids >= 0, ids, n_exp), True)
    return hit[:, :n_exp]


# ---- the globally consistent dispatch layout -------------------------------------------------------------------

@register
class EpDispatchLayout(GoldenOp):
    """`dispatch_layout(topk_idx, experts_per_rank) -> (tokens_per_rank, tokens_per_expert, rank_offset,
    expert_offset)`: where every token of every rank lands, consistent across ranks (torch).

    E = world * experts_per_rank experts; expert e lives on rank e // experts_per_rank. Rank s holds topk_idx_s
    [T_s, k] int64 (distinct expert ids per row, or -1). A rank's receive buffer lists the tokens it receives (a
    token with several experts on it once) ordered by (source rank, token index); an expert's batch lists the
    tokens routed to it ordered the same way. Outputs of rank s (all int64):
    tokens_per_rank [world]: its tokens with at least one expert on each rank; tokens_per_expert [E]: the tokens
    of ALL ranks routed to each expert (the same on every rank); rank_offset [T_s, world]: token i's row in rank
    d's receive buffer, -1 where it sends nothing to d; expert_offset [T_s, k]: entry (i, j)'s row in the batch of
    expert topk_idx[i, j], -1 for -1 entries.

    case.shape = [T], dtype int64; params: the routing of `_topk_route` (experts_per_rank, topk required), and
    empty_rank (that rank has T = 0), min_tokens (each rank's T is private, uniform in [min_tokens, T]).
    nccl-tests size: the bytes of topk_idx.
    """

    name = "ep_dispatch_layout"
    nccl_op = None
    functions = ("dispatch_layout",)
    outputs = ("tokens_per_rank", "tokens_per_expert", "rank_offset", "expert_offset")
    extra = ("empty_rank", "min_tokens")

    def validate_case(self, case):
        if len(case.shape) != 1 or case.shape[0] < 1:
            raise ValueError(f"shape must be [tokens] with tokens >= 1, got {case.shape}")
        if case.dtype != "int64":
            raise ValueError(f"dtype must be int64 (the dtype of topk_idx), got {case.dtype}")
        _validate_route(case, self.extra)
        _int_param(case, "empty_rank", low=0)
        _int_param(case, "min_tokens", low=0)

    def supports_world(self, world, case):
        return world >= 2 or case.params.get("idle_rank") is None

    def make_inputs(self, case, rank, world, seed):
        gen = generator(seed)
        t = _rank_tokens(case, rank, world, gen, int(case.shape[0]))
        return {"topk_idx": _topk_route(case, world, t, gen)}

    def call(self, fns, inputs, case, rank, world):
        res = fns["dispatch_layout"](inputs["topk_idx"], int(case.params["experts_per_rank"]))
        return _results(res, self.outputs, "dispatch_layout")

    def expected(self, case, world, inputs):
        epr = int(case.params["experts_per_rank"])
        n_exp = world * epr
        hits = [_rank_hits(i["topk_idx"], epr, world).to(torch.int64) for i in inputs]
        per_rank = [h.sum(0) for h in hits]
        per_expert = [_expert_counts(i["topk_idx"], n_exp) for i in inputs]
        total = torch.stack(per_expert).sum(0)
        out = []
        rank_base = torch.zeros(world, dtype=torch.int64)
        exp_base = torch.zeros(n_exp, dtype=torch.int64)
        for s, inp in enumerate(inputs):
            ids = inp["topk_idx"]
            h = hits[s]
            rank_offset = torch.where(h > 0, rank_base + torch.cumsum(h, 0) - 1, -1)
            rows = _rows_of(ids, n_exp).to(torch.int64)
            pos = exp_base + torch.cumsum(rows, 0) - 1  # [T, E]: the row's place in each expert's batch
            safe = ids.clamp_min(0)
            expert_offset = torch.where(ids >= 0, pos.gather(1, safe), -1)
            out.append({"tokens_per_rank": per_rank[s].clone(), "tokens_per_expert": total.clone(),
                        "rank_offset": rank_offset, "expert_offset": expert_offset})
            rank_base = rank_base + per_rank[s]
            exp_base = exp_base + per_expert[s]
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = dict(perf.params)
        params.setdefault("experts_per_rank", 8)
        params.setdefault("topk", 4)
        t = max(1, size_bytes // (int(params["topk"]) * 8))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t], dtype="int64", params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * int(case.params["topk"]) * 8


# ---- dispatch and combine with a per-expert capacity -----------------------------------------------------------

@register
class MoeCapacityDrop(MoeDispatchCombine):
    """`moe_forward(tokens, expert_ids, expert_fn, experts_per_rank, capacity) -> y`: top-1 dispatch/combine where
    each expert processes at most `capacity` tokens.

    As `moe_dispatch_combine` (the same secret row-bound expert transforms, the same count of the rows each local
    expert processed), except that expert e keeps only the first C = capacity tokens routed to it in global token
    order (source rank, then token index) and drops the rest: y[i] is expert_ids[i]'s output for tokens[i] when
    token i is kept and exactly 0 when it is dropped, and expert_rows[j] = min(C, tokens routed to that expert).
    C = floor(capacity_factor * T * world / E) with T = case.shape[0] (the nominal tokens per rank, also where
    empty_rank has none), E = world * experts_per_rank; params: those of moe_dispatch_combine plus
    capacity_factor (number >= 0, required). The benchmark's perf.params name capacity_factor too.
    """

    name = "moe_capacity_drop"

    def validate_case(self, case):
        super().validate_case(case)
        if "capacity_factor" not in case.params:
            raise ValueError("params.capacity_factor (a number >= 0) is required")
        _num_param(case, "capacity_factor", default=1.0, low=0.0)

    @staticmethod
    def capacity(case, world: int) -> int:
        n_exp = world * int(case.params["experts_per_rank"])
        return int(math.floor(float(case.params["capacity_factor"]) * int(case.shape[0]) * world / n_exp + 1e-9))

    def call(self, fns, inputs, case, rank, world):
        c = self.capacity(case, world)
        fn = fns["moe_forward"]
        return super().call({"moe_forward": lambda t, ids, efn, epr: fn(t, ids, efn, epr, c)}, inputs, case, rank,
                            world)

    def kept(self, case, world, inputs) -> list[torch.Tensor]:
        """Per rank, [T] bool: the token is among the first C routed to its expert in (rank, index) order."""
        n_exp = world * int(case.params["experts_per_rank"])
        c = self.capacity(case, world)
        used = torch.zeros(n_exp, dtype=torch.int64)
        out = []
        for inp in inputs:
            ids = inp["expert_ids"]
            rows = torch.zeros((int(ids.shape[0]), n_exp), dtype=torch.int64)
            rows.scatter_(1, ids[:, None], 1)
            pos = (used + torch.cumsum(rows, 0) - 1).gather(1, ids[:, None])[:, 0] if ids.numel() else ids
            out.append(pos < c)
            used += torch.bincount(ids, minlength=n_exp)
        return out

    def expected(self, case, world, inputs):
        c = self.capacity(case, world)
        out = super().expected(case, world, inputs)
        for o, keep in zip(out, self.kept(case, world, inputs)):
            o["y"][~keep] = 0
            o["expert_rows"] = o["expert_rows"].clamp_max(c)
        return out

    def expected_samples(self, case, world, inputs, pick):
        d = int(case.shape[1])
        c = self.capacity(case, world)
        seen: dict[tuple[int, str], torch.Tensor] = {}

        def recording(rank: int, name: str, numel: int) -> torch.Tensor:
            seen[(rank, name)] = idx = pick(rank, name, numel)
            return idx

        out = super().expected_samples(case, world, inputs, recording)
        for r, keep in enumerate(self.kept(case, world, inputs)):
            rows = seen[(r, "y")] // d
            out[r]["y"] = torch.where(keep[rows], out[r]["y"], torch.zeros_like(out[r]["y"]))
            out[r]["expert_rows"] = out[r]["expert_rows"].clamp_max(c)
        return out


# ---- low-latency dispatch into fixed-size per-expert slots ------------------------------------------------------

@register
class EpLowLatencyDispatch(GoldenOp):
    """`low_latency_dispatch(x, topk_idx, max_tokens, experts_per_rank) -> (recv_x, recv_count, recv_src_idx)`:
    top-k dispatch into fixed per-(expert, source) slots, as DeepEP's low-latency mode lays them out.

    case.shape = [M, d]: M = max_tokens, the most tokens any rank has; rank s holds x_s [T_s, d] (T_s <= M, private:
    params.min_tokens) and topk_idx_s [T_s, k] (the routing of `_topk_route`). Rank r, local expert l (global
    e = r * experts_per_rank + l), source s: the slot of rows [s*M, (s+1)*M) of recv_x[l] ([epr, world*M, d], the
    dtype of x) holds, from its first row, x_s[i] for every token i of s with e among its top-k, in increasing i;
    recv_src_idx [epr, world*M] int64 holds those i at the same places; recv_count [epr, world] int64 the number
    of such tokens. Rows of a slot past its count are padding: never checked. nccl-tests size: the bytes of x at
    M tokens.
    """

    name = "ep_low_latency_dispatch"
    nccl_op = None
    functions = ("low_latency_dispatch",)
    outputs = ("recv_x", "recv_count", "recv_src_idx")
    extra = ("min_tokens",)

    def validate_case(self, case):
        if len(case.shape) != 2 or case.shape[0] < 1 or case.shape[1] < 1:
            raise ValueError(f"shape must be [max_tokens, hidden] with both >= 1, got {case.shape}")
        if not to_dtype(case.dtype).is_floating_point:
            raise ValueError(f"dtype must be a floating type, got {case.dtype}")
        _validate_route(case, self.extra)
        _int_param(case, "min_tokens", low=0)

    def supports_world(self, world, case):
        return world >= 2 or case.params.get("idle_rank") is None

    def make_inputs(self, case, rank, world, seed):
        m, d = (int(s) for s in case.shape)
        gen = generator(seed)
        t = _rank_tokens(case, rank, world, gen, m)
        x = rand([t, d], case.dtype, gen)
        return {"x": x, "topk_idx": _topk_route(case, world, t, gen)}

    def call(self, fns, inputs, case, rank, world):
        res = fns["low_latency_dispatch"](inputs["x"], inputs["topk_idx"], int(case.shape[0]),
                                          int(case.params["experts_per_rank"]))
        return _results(res, self.outputs, "low_latency_dispatch")

    def slots(self, case, world, inputs, r: int) -> list[list[torch.Tensor]]:
        """slots[l][s]: the token indices of rank s routed to rank r's local expert l, increasing."""
        epr = int(case.params["experts_per_rank"])
        return [[(inp["topk_idx"] == r * epr + l).any(1).nonzero()[:, 0] for inp in inputs] for l in range(epr)]

    def expected(self, case, world, inputs):
        """Padding rows zero and src -1 (verify masks them out of both sides before comparing)."""
        m, d = (int(s) for s in case.shape)
        epr = int(case.params["experts_per_rank"])
        out = []
        for r in range(world):
            recv_x = torch.zeros((epr, world * m, d), dtype=to_dtype(case.dtype))
            src = torch.full((epr, world * m), -1, dtype=torch.int64)
            count = torch.zeros((epr, world), dtype=torch.int64)
            for l, per_src in enumerate(self.slots(case, world, inputs, r)):
                for s, idx in enumerate(per_src):
                    n = int(idx.numel())
                    recv_x[l, s * m:s * m + n] = inputs[s]["x"][idx]
                    src[l, s * m:s * m + n] = idx
                    count[l, s] = n
            out.append({"recv_x": recv_x, "recv_count": count, "recv_src_idx": src})
        return out

    def verify(self, case, world, inputs, outputs, tol):
        m = int(case.shape[0])
        dt = to_dtype(case.dtype)
        for r, (exp, got) in enumerate(zip(self.expected(case, world, inputs), outputs)):
            def bad(name: str, **kw) -> dict:
                return {"case": case.name, "rank": r, "output": name, **kw}

            for name in self.outputs:
                g = got.get(name)
                if g is None:
                    return bad(name, reason="missing", detail=f"rank {r} returned no {name}")
                if tuple(g.shape) != tuple(exp[name].shape):
                    return bad(name, reason="shape", expected=str(list(exp[name].shape)), got=str(list(g.shape)),
                               detail=f"{name} has the wrong shape")
            if got["recv_x"].dtype != dt:
                return bad("recv_x", reason="dtype", expected=str(dt), got=str(got["recv_x"].dtype),
                           detail="recv_x must have the dtype of x")
            for name in ("recv_count", "recv_src_idx"):
                if got[name].dtype != torch.int64:
                    return bad(name, reason="dtype", expected="torch.int64", got=str(got[name].dtype))
            mm = compare_tensor(exp["recv_count"], got["recv_count"], tol)
            if mm:
                return {**mm, **bad("recv_count")}
            # rows of a slot past its count are padding: take them out of both sides
            valid = torch.arange(world * m)[None, :] % m < exp["recv_count"].repeat_interleave(m, dim=1)
            for name in ("recv_src_idx", "recv_x"):
                g = got[name].detach().cpu()
                pad = ~valid if g.dim() == 2 else ~valid[:, :, None].expand_as(g)
                g = g.masked_fill(pad, 0)
                e = exp[name].masked_fill(pad, 0)
                mm = compare_tensor(e, g, tol)
                if mm:
                    out = {**mm, **bad(name)}
                    if mm.get("index"):
                        l, row = mm["index"][0], mm["index"][1]
                        out["detail"] = (f"local expert {l}, slot of source rank {row // m}, row {row % m} of "
                                         f"{int(exp['recv_count'][l, row // m])} valid rows")
                    return out
        return None

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = dict(perf.params)
        d = int(params.pop("hidden", 512))
        params.setdefault("experts_per_rank", 2)
        params.setdefault("topk", 2)
        m = max(1, size_bytes // (d * _elem(perf.dtype)))
        params["min_tokens"] = m  # every rank full: the latency of a whole slab exchange
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[m, d], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * int(case.shape[1]) * _elem(case.dtype)


# ---- two-stage (node, then rail) dispatch -----------------------------------------------------------------------

@register
class EpHierarchicalDispatch(GoldenOp):
    """`hierarchical_dispatch(x, topk_idx, experts_per_rank, group_size) -> (recv_x, recv_src, recv_topk)`: top-k
    dispatch on ranks grouped into nodes of group_size consecutive ranks.

    Rank s holds x_s [T, d] and topk_idx_s [T, k] (the routing of `_topk_route`; T is the same on every rank).
    Rank r returns every token (s, i) of every rank with at least one expert on r, once, ordered by (s, i):
    recv_x [n, d] (the dtype of x), recv_src [n, 2] int64 = (s, i), recv_topk [n, k] int64 = the token's top-k row
    with each expert on r made local (e - r * experts_per_rank) and every other entry -1. The nodes do not change
    the result; they are the structure the task's cost is about. params: the routing params and group_size (int
    >= 1, required, dividing the world size; `supports_world`). nccl-tests size: the bytes of one rank's x.
    """

    name = "ep_hierarchical_dispatch"
    nccl_op = None
    functions = ("hierarchical_dispatch",)
    outputs = ("recv_x", "recv_src", "recv_topk")
    extra = ("group_size",)

    def validate_case(self, case):
        if len(case.shape) != 2 or case.shape[0] < 1 or case.shape[1] < 1:
            raise ValueError(f"shape must be [tokens, hidden] with both >= 1, got {case.shape}")
        if not to_dtype(case.dtype).is_floating_point:
            raise ValueError(f"dtype must be a floating type, got {case.dtype}")
        _validate_route(case, self.extra)
        if _int_param(case, "group_size", low=1) is None:
            raise ValueError("params.group_size (int >= 1) is required")

    def supports_world(self, world, case):
        if world % int(case.params["group_size"]):
            return False
        return world >= 2 or case.params.get("idle_rank") is None

    def make_inputs(self, case, rank, world, seed):
        t, d = (int(s) for s in case.shape)
        gen = generator(seed)
        x = rand([t, d], case.dtype, gen)
        return {"x": x, "topk_idx": _topk_route(case, world, t, gen)}

    def call(self, fns, inputs, case, rank, world):
        res = fns["hierarchical_dispatch"](inputs["x"], inputs["topk_idx"], int(case.params["experts_per_rank"]),
                                           int(case.params["group_size"]))
        return _results(res, self.outputs, "hierarchical_dispatch")

    def expected(self, case, world, inputs):
        epr = int(case.params["experts_per_rank"])
        out = []
        for r in range(world):
            xs, srcs, tops = [], [], []
            for s, inp in enumerate(inputs):
                ids = inp["topk_idx"]
                mine = _owners(ids, epr) == r
                idx = mine.any(1).nonzero()[:, 0]
                xs.append(inp["x"][idx])
                srcs.append(torch.stack([torch.full_like(idx, s), idx], 1))
                tops.append(torch.where(mine, ids - r * epr, -1)[idx])
            out.append({"recv_x": torch.cat(xs), "recv_src": torch.cat(srcs), "recv_topk": torch.cat(tops)})
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = dict(perf.params)
        d = int(params.pop("hidden", 256))
        params.setdefault("experts_per_rank", 2)
        params.setdefault("topk", 4)
        params.setdefault("group_size", 2)
        if world % int(params["group_size"]):
            params["group_size"] = 1
        t = max(1, size_bytes // (d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t, d], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * int(case.shape[1]) * _elem(case.dtype)


# ---- a whole expert-parallel MoE layer forward ------------------------------------------------------------------

#: the k-th and (k+1)-th largest router logits of every token differ by at least this much (rows closer are
#: redrawn), so that float32 logits and the coordinator's float64 ones choose the same experts
ROUTER_GAP = 1e-3
#: router bias of the experts of params.idle_rank: never among the top-k
IDLE_BIAS = -60.0


@register
class EpMoeLayerForward(GoldenOp):
    """`moe_layer_forward(x, router_weight, router_bias, topk, w1, w3, w2) -> y`: a top-k MoE layer, experts
    spread over the ranks.

    E = world * experts_per_rank; expert e lives on rank e // epr as local expert l = e % epr. Rank s holds x_s
    [T_s, d] (private), the router router_weight [d, E] and router_bias [E] (replicated: the same on every rank),
    and its own experts' SwiGLU weights w1, w3 [epr, d, f], w2 [epr, f, d] (private). Per token: logits =
    x @ router_weight + router_bias; the k largest logits choose the experts (the k-th and (k+1)-th differ by at
    least ROUTER_GAP); gates = softmax over those k logits; y = sum_j gate_j * expert_{e_j}(x), expert_e(x) =
    (silu(x @ w1[l]) * (x @ w3[l])) @ w2[l] with the owner's weights. case.shape = [T, d]; params: experts_per_rank,
    topk, ffn (f) required; skew (spread of the router bias, default 0.5), routing_seed, idle_rank (its experts'
    bias is IDLE_BIAS: they get no token), empty_rank (that rank has no tokens). nccl-tests size: the bytes of x.
    """

    name = "ep_moe_layer_forward"
    nccl_op = None
    functions = ("moe_layer_forward",)
    known_params = ("experts_per_rank", "topk", "ffn", "skew", "routing_seed", "idle_rank", "empty_rank")

    def validate_case(self, case):
        unknown = sorted(set(case.params) - set(self.known_params))
        if unknown:
            raise ValueError(f"unknown params {unknown} (known: {', '.join(self.known_params)})")
        if len(case.shape) != 2 or case.shape[0] < 1 or case.shape[1] < 1:
            raise ValueError(f"shape must be [tokens, hidden] with both >= 1, got {case.shape}")
        if case.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64 (the router's choice must not depend on rounding), "
                             f"got {case.dtype}")
        for key in ("experts_per_rank", "topk", "ffn"):
            if _int_param(case, key, low=1) is None:
                raise ValueError(f"params.{key} (int >= 1) is required")
        _num_param(case, "skew", default=0.5, low=0.0)
        _int_param(case, "routing_seed", default=0)
        _int_param(case, "idle_rank", low=0)
        _int_param(case, "empty_rank", low=0)

    def supports_world(self, world, case):
        epr, k = int(case.params["experts_per_rank"]), int(case.params["topk"])
        live = world - (1 if case.params.get("idle_rank") is not None else 0)
        return k <= live * epr and (world >= 2 or case.params.get("idle_rank") is None)

    def router(self, case, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The replicated router (float64): weight [d, E] ~ N(0, 1/d), bias [E] ~ skew * N(0, 1)."""
        d = int(case.shape[1])
        epr = int(case.params["experts_per_rank"])
        n_exp = world * epr
        g = generator(_shared_seed(0x40E7, int(case.params.get("routing_seed", 0)), world, d, epr))
        w = torch.randn((d, n_exp), generator=g, dtype=torch.float64) / math.sqrt(d)
        b = float(case.params.get("skew", 0.5)) * torch.randn(n_exp, generator=g, dtype=torch.float64)
        idle = case.params.get("idle_rank")
        if idle is not None:
            b[torch.arange(n_exp) // epr == int(idle) % world] = IDLE_BIAS
        return w, b

    def make_inputs(self, case, rank, world, seed):
        t, d = (int(s) for s in case.shape)
        epr, k, f = (int(case.params[key]) for key in ("experts_per_rank", "topk", "ffn"))
        dt = to_dtype(case.dtype)
        gen = generator(seed)
        empty = case.params.get("empty_rank")
        if empty is not None and rank == int(empty) % world:
            t = 0
        w, b = self.router(case, world)
        w, b = w.to(dt), b.to(dt)
        x = rand([t, d], case.dtype, gen)
        n_exp = world * epr
        for _ in range(64):  # redraw the rows whose k-th and (k+1)-th logits are too close to call
            if k >= n_exp or t == 0:
                break
            top = (wide(x) @ wide(w) + wide(b)).topk(k + 1, dim=1).values
            close = (top[:, k - 1] - top[:, k]) < ROUTER_GAP
            if not bool(close.any()):
                break
            x[close] = rand([int(close.sum()), d], case.dtype, gen)
        else:
            raise RuntimeError("could not draw router inputs with a clear top-k")
        return {"x": x, "router_weight": w, "router_bias": b,
                "w1": (rand([epr, d, f], case.dtype, gen) / math.sqrt(d)).to(dt),
                "w3": (rand([epr, d, f], case.dtype, gen) / math.sqrt(d)).to(dt),
                "w2": (rand([epr, f, d], case.dtype, gen) / math.sqrt(f)).to(dt)}

    def call(self, fns, inputs, case, rank, world):
        y = fns["moe_layer_forward"](inputs["x"], inputs["router_weight"], inputs["router_bias"],
                                     int(case.params["topk"]), inputs["w1"], inputs["w3"], inputs["w2"])
        return {"y": expect_tensor(y, "moe_layer_forward's return value")}

    def expected(self, case, world, inputs):
        k = int(case.params["topk"])
        w1 = torch.cat([wide(i["w1"]) for i in inputs])  # [E, d, f], expert e at e
        w3 = torch.cat([wide(i["w3"]) for i in inputs])
        w2 = torch.cat([wide(i["w2"]) for i in inputs])
        out = []
        for inp in inputs:
            x = wide(inp["x"])
            logits = x @ wide(inp["router_weight"]) + wide(inp["router_bias"])
            top = logits.topk(k, dim=1)
            gates = torch.softmax(top.values, dim=1)
            y = torch.zeros_like(x)
            for e in torch.unique(top.indices).tolist():
                rows, slot = (top.indices == e).nonzero(as_tuple=True)
                xe = x[rows]
                h = torch.nn.functional.silu(xe @ w1[e]) * (xe @ w3[e])
                y.index_add_(0, rows, gates[rows, slot, None] * (h @ w2[e]))
            out.append({"y": narrow(y, case.dtype)})
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = dict(perf.params)
        d = int(params.pop("hidden", 256))
        params.setdefault("experts_per_rank", 2)
        params.setdefault("topk", 2)
        params.setdefault("ffn", 256)
        t = max(1, size_bytes // (d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t, d], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * int(case.shape[1]) * _elem(case.dtype)
