"""Golden semantics of ep_sparse tasks (issue #22, second part).

The jagged sparse-feature all-to-all of table-wise sharded embeddings (lengths and ids, variable batch per rank),
the backward of an expert-parallel MoE layer (the layer of ep_patterns' forward, routing given), and H2's
deduplicated dispatch below its marker.
"""

from __future__ import annotations

import functools
import math

import torch

from . import register
from .base import GoldenOp, generator, int_param, narrow, num_param, rand, to_dtype, wide
from .compare import compare_tensor
from .ep_patterns import _elem, _rank_tokens, _results, _validate_route
from .moe import _int_param as _moe_int_param, _shared_seed, _topk_route

_opt_int = functools.partial(int_param, optional=True)


# ---- the jagged sparse-feature all-to-all of table-wise sharded embeddings -----------------------------------------

#: how features are placed on ranks (params.placement)
PLACEMENTS = ("round_robin", "blocked", "random", "skewed")
#: ids are drawn uniform in [0, ID_HIGH[dtype]): hashed ids of a huge id space, effectively unique
ID_HIGH = {"int64": 1 << 62, "int32": (1 << 31) - 1}


@register
class EpSparseFeatureAlltoall(GoldenOp):
    """`sparse_feature_alltoall(lengths, values, feature_owner) -> (out_lengths, out_values)`: the jagged all-to-all
    of table-wise sharded embedding lookups (TorchRec's KeyedJaggedTensor all-to-all, variable batch per rank).

    F features; feature f's table lives on rank feature_owner[f] (int64 [F], the same on every rank: params
    placement / placement_seed). Rank s holds a batch of B_s samples (private: case.shape[1], or 0 on
    params.empty_rank, or uniform in [params.min_batch, B]); lengths_s [F * B_s] lists, feature-major, how many ids
    sample b has for feature f (at f * B_s + b), and values_s [sum(lengths_s)] holds the ids in the same order
    (feature 0's samples' lists one after the other, then feature 1's, ...). Both have the case dtype (int32 or
    int64). Rank r returns, for its features f_1 < f_2 < ... (F_r of them, possibly none), the same jagged layout over
    the global batch of B = sum B_s samples ordered (source rank, sample index): out_lengths [F_r * B] and out_values
    (their ids), exact.

    case.shape = [F, B]; params: mean_len (number >= 0, default 4: mean list length; each feature's mean is
    mean_len * exp(len_skew * N(0, 1)), shared), len_skew (default 0), zero_frac (share of empty lists, default 0),
    empty_features (int: that many features, shared, have no ids on any rank), placement (one of PLACEMENTS,
    default round_robin), placement_seed, empty_rank, min_batch. nccl-tests size: the bytes of one rank's values at
    the nominal batch and mean_len (F * B * mean_len elements).
    """

    name = "ep_sparse_feature_alltoall"
    nccl_op = None
    functions = ("sparse_feature_alltoall",)
    outputs = ("out_lengths", "out_values")
    known_params = ("mean_len", "len_skew", "zero_frac", "empty_features", "placement", "placement_seed",
                    "empty_rank", "min_batch")

    def validate_case(self, case):
        unknown = sorted(set(case.params) - set(self.known_params))
        if unknown:
            raise ValueError(f"unknown params {unknown} (known: {', '.join(self.known_params)})")
        if len(case.shape) != 2 or case.shape[0] < 1 or case.shape[1] < 1:
            raise ValueError(f"shape must be [features, batch] with both >= 1, got {case.shape}")
        if case.dtype not in ID_HIGH:
            raise ValueError(f"dtype must be int32 or int64 (the dtype of lengths and values), got {case.dtype}")
        num_param(case, "mean_len", default=4.0, low=0.0)
        num_param(case, "len_skew", default=0.0, low=0.0)
        num_param(case, "zero_frac", default=0.0, low=0.0, high=1.0)
        _opt_int(case, "empty_features", low=0, high=int(case.shape[0]))
        placement = case.params.get("placement", "round_robin")
        if placement not in PLACEMENTS:
            raise ValueError(f"params.placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
        _opt_int(case, "placement_seed", default=0)
        _opt_int(case, "empty_rank", low=0)
        _opt_int(case, "min_batch", low=0)

    @staticmethod
    def feature_owner(case, world: int) -> torch.Tensor:
        """[F] int64: the rank of each feature's table, from public case data (the same on every rank)."""
        n_feat = int(case.shape[0])
        placement = case.params.get("placement", "round_robin")
        g = generator(_shared_seed(0x5FEA, PLACEMENTS.index(placement), int(case.params.get("placement_seed", 0)),
                                   world, n_feat))
        f = torch.arange(n_feat, dtype=torch.int64)
        if placement == "round_robin":
            return f % world
        if placement == "blocked":
            return f * world // n_feat
        if placement == "random":
            return torch.randint(0, world, (n_feat,), generator=g, dtype=torch.int64)
        # skewed: Zipf(1.5) over a shuffled rank order; most tables on one or two ranks
        order = torch.randperm(world, generator=g)
        p = torch.empty(world, dtype=torch.float64)
        p[order] = (1.0 + torch.arange(world, dtype=torch.float64)) ** -1.5
        return torch.multinomial(p, n_feat, replacement=True, generator=g).to(torch.int64)

    @staticmethod
    def feature_means(case, world: int) -> torch.Tensor:
        """[F] float64: each feature's mean list length (shared); 0 for the params.empty_features ones."""
        n_feat = int(case.shape[0])
        g = generator(_shared_seed(0x5FEB, int(case.params.get("placement_seed", 0)), world, n_feat))
        m = float(case.params.get("mean_len", 4.0)) * torch.exp(
            float(case.params.get("len_skew", 0.0)) * torch.randn(n_feat, generator=g, dtype=torch.float64))
        empty = int(case.params.get("empty_features", 0) or 0)
        m[torch.randperm(n_feat, generator=g)[:empty]] = 0.0
        return m

    def make_inputs(self, case, rank, world, seed):
        n_feat, cap = (int(s) for s in case.shape)
        gen = generator(seed)
        b = cap
        empty = case.params.get("empty_rank")
        low = case.params.get("min_batch")
        if empty is not None and rank == int(empty) % world:
            b = 0
        elif low is not None and int(low) < cap:
            b = int(torch.randint(int(low), cap + 1, (1,), generator=gen))
        dt = to_dtype(case.dtype)
        m = self.feature_means(case, world)
        u = torch.rand((n_feat, b), generator=gen, dtype=torch.float64)
        lengths = torch.minimum(torch.floor(u * (2 * m[:, None] + 1)), 2 * m[:, None]).clamp_min(0).to(torch.int64)
        zf = float(case.params.get("zero_frac", 0.0))
        if zf > 0:
            lengths[torch.rand((n_feat, b), generator=gen) < zf] = 0
        n = int(lengths.sum())
        values = torch.randint(0, ID_HIGH[case.dtype], (n,), generator=gen, dtype=torch.int64)
        return {"lengths": lengths.reshape(-1).to(dt), "values": values.to(dt),
                "feature_owner": self.feature_owner(case, world)}

    def call(self, fns, inputs, case, rank, world):
        res = fns["sparse_feature_alltoall"](inputs["lengths"], inputs["values"], inputs["feature_owner"])
        return _results(res, self.outputs, "sparse_feature_alltoall")

    def expected(self, case, world, inputs):
        n_feat = int(case.shape[0])
        dt = to_dtype(case.dtype)
        owner = self.feature_owner(case, world)
        per_src = []  # per source rank: lengths [F, B_s] and each feature's ids
        for inp in inputs:
            lens = inp["lengths"].to(torch.int64).view(n_feat, -1)
            per_src.append((lens, torch.split(inp["values"], lens.sum(1).tolist())))
        out = []
        for r in range(world):
            feats = (owner == r).nonzero()[:, 0].tolist()
            lens = [torch.cat([ls[f] for ls, _ in per_src]) for f in feats]
            vals = [v[f] for f in feats for _, v in per_src]
            out.append({"out_lengths": torch.cat(lens).to(dt) if lens else torch.empty(0, dtype=dt),
                        "out_values": torch.cat(vals) if vals else torch.empty(0, dtype=dt)})
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = dict(perf.params)
        n_feat = int(params.pop("features", 16))
        params.setdefault("mean_len", 8)
        per_sample = max(1.0, n_feat * float(params["mean_len"])) * _elem(perf.dtype)
        b = max(1, int(size_bytes // per_sample))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[n_feat, b], dtype=perf.dtype,
                        params=params)

    def metric_bytes(self, case, world):
        return int(round(int(case.shape[0]) * int(case.shape[1]) * float(case.params.get("mean_len", 4.0)))) * \
            _elem(case.dtype)


# ---- the backward of an expert-parallel MoE layer -------------------------------------------------------------------

def _dsilu(a: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(a)
    return s * (1 + a * (1 - s))


@register
class EpMoeLayerBackward(GoldenOp):
    """`moe_layer_backward(x, topk_idx, gates, dy, w1, w3, w2) -> (dx, dgates, dw1, dw3, dw2)`: the gradients of a
    top-k MoE layer whose experts are spread over the ranks (the layer of `ep_moe_layer_forward`, routing given).

    E = world * epr; expert e lives on rank e // epr as local expert l = e % epr. Rank s holds x_s [T_s, d],
    topk_idx_s [T_s, k] (moe.py's `_topk_route`: distinct experts per row, or -1), gates_s [T_s, k] (a softmax over
    the row's valid entries, 0 at -1 entries), dy_s [T_s, d] (the upstream gradient of y) and its own experts' SwiGLU
    weights w1, w3 [epr, d, f], w2 [epr, f, d]; all private. Forward: y_i = sum_j gates[i, j] * expert_{e_j}(x_i),
    expert_e(v) = (silu(v @ w1[l]) * (v @ w3[l])) @ w2[l]. Outputs of rank r: dx = dL/dx [T_r, d] (through the
    experts; the gates are inputs), dgates [T_r, k] = <dy_i, expert_{e_j}(x_i)> (0 at -1 entries), and the gradients
    of its own experts' weights dw1, dw3 [epr, d, f], dw2 [epr, f, d] (summed over the tokens of all ranks; 0 for an
    expert no token chose). case.shape = [T, d], float32 or float64; params: the routing of `_topk_route`, ffn (f,
    required), empty_rank, min_tokens. nccl-tests size: the bytes of one rank's x at T tokens.
    """

    name = "ep_moe_layer_backward"
    nccl_op = None
    functions = ("moe_layer_backward",)
    outputs = ("dx", "dgates", "dw1", "dw3", "dw2")
    extra = ("ffn", "empty_rank", "min_tokens")

    def validate_case(self, case):
        if len(case.shape) != 2 or case.shape[0] < 1 or case.shape[1] < 1:
            raise ValueError(f"shape must be [tokens, hidden] with both >= 1, got {case.shape}")
        if case.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {case.dtype}")
        _validate_route(case, self.extra)
        if _opt_int(case, "ffn", low=1) is None:
            raise ValueError("params.ffn (int >= 1) is required")
        _opt_int(case, "empty_rank", low=0)
        _opt_int(case, "min_tokens", low=0)

    def supports_world(self, world, case):
        return world >= 2 or case.params.get("idle_rank") is None

    def make_inputs(self, case, rank, world, seed):
        t, d = (int(s) for s in case.shape)
        epr, f = int(case.params["experts_per_rank"]), int(case.params["ffn"])
        dt = to_dtype(case.dtype)
        gen = generator(seed)
        t = _rank_tokens(case, rank, world, gen, t)
        x = rand([t, d], case.dtype, gen)
        ids = _topk_route(case, world, t, gen)
        logits = torch.randn(tuple(ids.shape), generator=gen, dtype=torch.float64)
        gates = torch.softmax(logits.masked_fill(ids < 0, -math.inf), dim=1).nan_to_num(0.0)  # all -1 rows: 0
        dy = rand([t, d], case.dtype, gen)
        return {"x": x, "topk_idx": ids, "gates": gates.to(dt), "dy": dy,
                "w1": (rand([epr, d, f], case.dtype, gen) / math.sqrt(d)).to(dt),
                "w3": (rand([epr, d, f], case.dtype, gen) / math.sqrt(d)).to(dt),
                "w2": (rand([epr, f, d], case.dtype, gen) / math.sqrt(f)).to(dt)}

    def call(self, fns, inputs, case, rank, world):
        res = fns["moe_layer_backward"](inputs["x"], inputs["topk_idx"], inputs["gates"], inputs["dy"],
                                        inputs["w1"], inputs["w3"], inputs["w2"])
        return _results(res, self.outputs, "moe_layer_backward")

    def expected(self, case, world, inputs):
        epr = int(case.params["experts_per_rank"])
        w1 = torch.cat([wide(i["w1"]) for i in inputs])  # [E, d, f], expert e at e
        w3 = torch.cat([wide(i["w3"]) for i in inputs])
        w2 = torch.cat([wide(i["w2"]) for i in inputs])
        dw1, dw3, dw2 = torch.zeros_like(w1), torch.zeros_like(w3), torch.zeros_like(w2)
        per_rank = []
        for inp in inputs:
            x, dy, g, ids = wide(inp["x"]), wide(inp["dy"]), wide(inp["gates"]), inp["topk_idx"]
            dx = torch.zeros_like(x)
            dg = torch.zeros_like(g)
            for e in torch.unique(ids[ids >= 0]).tolist():
                rows, slot = (ids == e).nonzero(as_tuple=True)
                xe, gy = x[rows], dy[rows]
                a, b = xe @ w1[e], xe @ w3[e]
                sa = torch.nn.functional.silu(a)
                h = sa * b
                dg[rows, slot] = ((h @ w2[e]) * gy).sum(1)
                gyw = gy * g[rows, slot, None]
                dh = gyw @ w2[e].T
                dw2[e] += h.T @ gyw
                da, db = dh * b * _dsilu(a), dh * sa
                dw1[e] += xe.T @ da
                dw3[e] += xe.T @ db
                dx.index_add_(0, rows, da @ w1[e].T + db @ w3[e].T)
            per_rank.append((dx, dg))
        out = []
        for r, (dx, dg) in enumerate(per_rank):
            mine = slice(r * epr, (r + 1) * epr)
            out.append({name: narrow(v, case.dtype) for name, v in
                        zip(self.outputs, (dx, dg, dw1[mine], dw3[mine], dw2[mine]))})
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


# ---- dedup dispatch: a token sent once per destination rank -------------------------------------------------------


@register
class EpDedupDispatch(GoldenOp):
    """`dedup_dispatch(x, topk_idx, experts_per_rank) -> (expert_x, expert_src, expert_counts)`: top-k dispatch into
    the receiver's per-expert layout (the input of a grouped GEMM), with the metadata a combine needs.

    E = world * experts_per_rank; expert e lives on rank e // epr as local expert e % epr. Rank s holds x_s [T_s, d]
    (private; T_s = case.shape[0], or 0 on params.empty_rank, or uniform in [params.min_tokens, T]) and topk_idx_s
    [T_s, k] (the routing of moe.py's `_topk_route`: distinct experts per row, or -1). An entry (s, i, j) is slot j
    of token i of rank s. Outputs of rank r: expert_counts [epr] int64, the entries of all ranks routed to each
    local expert; expert_x [N, d] (the dtype of x; N = sum of expert_counts): the rows of local expert 0, then 1,
    ..., each expert's rows ordered by (s, i), row = x_s[i]; expert_src [N, 3] int64: (s, i, j) of each row. All
    exact. A token with several experts on r appears once per expert in the outputs; how often it crosses the
    wire is the task's cost, not its semantics. nccl-tests size: the bytes of one rank's x at T tokens.
    """

    name = "ep_dedup_dispatch"
    nccl_op = None
    functions = ("dedup_dispatch",)
    outputs = ("expert_x", "expert_src", "expert_counts")
    extra = ("empty_rank", "min_tokens")

    def validate_case(self, case):
        if len(case.shape) != 2 or case.shape[0] < 1 or case.shape[1] < 1:
            raise ValueError(f"shape must be [tokens, hidden] with both >= 1, got {case.shape}")
        if not to_dtype(case.dtype).is_floating_point:
            raise ValueError(f"dtype must be a floating type, got {case.dtype}")
        _validate_route(case, self.extra)
        _moe_int_param(case, "empty_rank", low=0)
        _moe_int_param(case, "min_tokens", low=0)

    def supports_world(self, world, case):
        return world >= 2 or case.params.get("idle_rank") is None

    def make_inputs(self, case, rank, world, seed):
        gen = generator(seed)
        t = _rank_tokens(case, rank, world, gen, int(case.shape[0]))
        x = rand([t, int(case.shape[1])], case.dtype, gen)
        return {"x": x, "topk_idx": _topk_route(case, world, t, gen)}

    def call(self, fns, inputs, case, rank, world):
        res = fns["dedup_dispatch"](inputs["x"], inputs["topk_idx"], int(case.params["experts_per_rank"]))
        return _results(res, self.outputs, "dedup_dispatch")

    def expected(self, case, world, inputs):
        epr, d = int(case.params["experts_per_rank"]), int(case.shape[1])
        dt = to_dtype(case.dtype)
        out = []
        for r in range(world):
            xs, srcs, counts = [], [], []
            for local in range(epr):
                n = 0
                for s, inp in enumerate(inputs):
                    rows, slot = (inp["topk_idx"] == r * epr + local).nonzero(as_tuple=True)  # rows increasing
                    xs.append(inp["x"][rows])
                    srcs.append(torch.stack([torch.full_like(rows, s), rows, slot], 1))
                    n += int(rows.numel())
                counts.append(n)
            out.append({"expert_x": torch.cat(xs) if xs else torch.empty((0, d), dtype=dt),
                        "expert_src": torch.cat(srcs).reshape(-1, 3).to(torch.int64),
                        "expert_counts": torch.tensor(counts, dtype=torch.int64)})
        return out

    def verify(self, case, world, inputs, outputs, tol):
        dt = to_dtype(case.dtype)
        want = {"expert_x": dt, "expert_src": torch.int64, "expert_counts": torch.int64}
        for r, (exp, got) in enumerate(zip(self.expected(case, world, inputs), outputs)):
            for name in ("expert_counts", "expert_src", "expert_x"):
                g = got.get(name)
                where = {"case": case.name, "rank": r, "output": name}
                if g is None:
                    return {**where, "reason": "missing", "detail": f"rank {r} returned no {name}"}
                if g.dtype != want[name]:
                    return {**where, "reason": "dtype", "expected": str(want[name]), "got": str(g.dtype),
                            "detail": f"{name} must have dtype {want[name]}"}
                mm = compare_tensor(exp[name], g.detach().cpu(), tol)
                if mm:
                    out = {**mm, **where}
                    if name != "expert_counts" and mm.get("index") and mm.get("reason") == "value":
                        row = mm["index"][0]
                        ends = torch.cumsum(exp["expert_counts"], 0)
                        local = int((ends <= row).sum())
                        s, i, j = (int(v) for v in exp["expert_src"][row])
                        out["detail"] = (f"row {row} (local expert {local}) should be token {i} of rank {s}, "
                                         f"top-k slot {j}")
                    return out
        return None

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = dict(perf.params)
        d = int(params.pop("hidden", 256))
        params.setdefault("experts_per_rank", 4)
        params.setdefault("topk", 8)
        t = max(1, size_bytes // (d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t, d], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * int(case.shape[1]) * _elem(case.dtype)
