"""Golden semantics of two kernel-level expert-parallel tasks about where tokens go before and while they move: the
count handshake that precedes a dispatch (DeepEP's notify_dispatch), and a dispatch into an expert-major receive
layout whose row order is fixed by (local expert, source rank, token index), never by thread scheduling."""

from __future__ import annotations

import threading

import torch

from . import register
from .base import GoldenOp, generator, rand, to_dtype
from .moe import (MAX_EXPERTS_PER_RANK, _cuda_only, _elem, _rank_hits, _shared_seed, _topk_route,
                  _topk_size_params, _validate_tokens_case, _validate_topk_routing)

# ---- ep/notify_counts --------------------------------------------------------------------------------------------


def notify_offsets(per_expert: list[torch.Tensor], per_rank: list[torch.Tensor], epr: int,
                   r: int) -> dict[str, torch.Tensor]:
    """Rank r's outputs from every rank's counts: expert_offsets [world + 1, epr] (row s: the entries that ranks
    0 .. s-1 send to each local expert of r; row world: the totals) and rank_offsets [world + 1] (the same over the
    tokens each rank sends to r)."""
    world = len(per_expert)
    got = torch.stack([c[r * epr:(r + 1) * epr].to(torch.int64) for c in per_expert])  # [world, epr]
    toks = torch.stack([c[r].to(torch.int64) for c in per_rank])  # [world]
    zero_row = torch.zeros((1, epr), dtype=torch.int64)
    expert_offsets = torch.cat([zero_row, torch.cumsum(got, 0)]).to(torch.int32)
    rank_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(toks, 0)]).to(torch.int32)
    assert expert_offsets.shape == (world + 1, epr)
    return {"expert_offsets": expert_offsets, "rank_offsets": rank_offsets}


@register
class EpNotifyCounts(GoldenOp):
    """`notify_counts` (cuda): the count handshake before an expert-parallel dispatch (DeepEP's notify_dispatch).

    case.shape = [T] (tokens per rank), case.dtype = int32; params: experts_per_rank and topk (required) and the
    routing params of `_topk_route`. Every call, rank s routes T tokens afresh (top-k, private) and is given only the
    counts of that routing: num_tokens_per_expert [E] int32 (entries that chose each expert, E = world *
    experts_per_rank, expert e on rank e // experts_per_rank) and num_tokens_per_rank [world] int32 (tokens with at
    least one expert on each rank, counted once). Outputs of rank r:
    expert_offsets [world + 1, epr] int32: row s < world, column l = the sum over sources s' < s of
    num_tokens_per_expert_{s'}[r * epr + l] (an exclusive prefix over sources); row world = the sum over all sources;
    rank_offsets [world + 1] int32: the same over num_tokens_per_rank_{s'}[r].
    nccl-tests size: the bytes of num_tokens_per_expert (4 E); the metric is latency.
    """

    name = "ep_notify_counts"
    nccl_op = None
    functions = ("notify_counts",)

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)

    def validate_case(self, case):
        if len(case.shape) != 1 or case.shape[0] < 1:
            raise ValueError(f"shape must be [tokens] with tokens >= 1, got {case.shape}")
        if case.dtype != "int32":
            raise ValueError(f"dtype must be int32 (the dtype of the counts), got {case.dtype}")
        _validate_topk_routing(case)

    def make_inputs(self, case, rank, world, seed):
        epr = int(case.params["experts_per_rank"])
        ids = _topk_route(case, world, int(case.shape[0]), generator(seed))
        per_expert = torch.bincount(ids[ids >= 0], minlength=world * epr).to(torch.int32)
        per_rank = _rank_hits(ids, epr, world).sum(0, dtype=torch.int32)
        return {"num_tokens_per_expert": per_expert, "num_tokens_per_rank": per_rank}

    def expected(self, case, world, inputs):
        epr = int(case.params["experts_per_rank"])
        pe = [inp["num_tokens_per_expert"] for inp in inputs]
        pr = [inp["num_tokens_per_rank"] for inp in inputs]
        return [notify_offsets(pe, pr, epr, r) for r in range(world)]

    def size_case(self, perf, size_bytes, world):
        """A size is the bytes of num_tokens_per_expert (4 E, whatever the world): E = size / 4 experts split over
        the ranks (at most 128 per rank); params.tokens is T (default 4096)."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        t = int(params.pop("tokens", 4096))
        params["experts_per_rank"] = max(1, min(MAX_EXPERTS_PER_RANK, size_bytes // (4 * world)))
        params.setdefault("topk", 8)
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t], dtype="int32", params=params)

    def metric_bytes(self, case, world):
        return 4 * world * int(case.params["experts_per_rank"])


# ---- ep/deterministic_slots --------------------------------------------------------------------------------------


def _public_rows(case, world: int, s: int) -> torch.Tensor:
    """Rank s's routing rows for the case, as a multiset fixed by public case data: every call presents them to s
    in a fresh private order (see `ExpertMajorDispatch.make_inputs`), so the counts are the same in every call
    while the rows' positions are not."""
    t = int(case.shape[0])
    epr, k = int(case.params["experts_per_rank"]), int(case.params["topk"])
    g = generator(_shared_seed(0x5107, int(case.params.get("routing_seed", 0)), world, t, k, epr, s))
    return _topk_route(case, world, t, g)


#: expert_counts by (case, world): every rank's make_inputs needs all ranks' counts, so a process that makes the
#: inputs of every rank (the coordinator, the device host) would otherwise route world x world times per call
_COUNTS: dict[tuple, torch.Tensor] = {}
_COUNTS_LOCK = threading.Lock()


def expert_counts(case, world: int) -> torch.Tensor:
    """[world, E] int32: entries of rank s's routing that chose expert e (the same in every call of a case)."""
    key = (tuple(int(v) for v in case.shape), case.dtype, tuple(sorted((k, repr(v)) for k, v in case.params.items())),
           int(world))
    with _COUNTS_LOCK:
        got = _COUNTS.get(key)
    if got is None:
        epr = int(case.params["experts_per_rank"])
        rows = [_public_rows(case, world, s) for s in range(world)]
        got = torch.stack([torch.bincount(ids[ids >= 0], minlength=world * epr) for ids in rows]).to(torch.int32)
        with _COUNTS_LOCK:
            if len(_COUNTS) >= 32:
                _COUNTS.clear()
            _COUNTS[key] = got
    return got.clone()


def expert_major_order(topk: list[torch.Tensor], epr: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's received rows, in order: (source rank, token index) of each, sorted by (local expert l, source s,
    token index i). The experts of a row are distinct, so no two entries share a key. Every rank has T tokens."""
    world = len(topk)
    ids = torch.stack(topk)  # [world, T, k]
    t = int(ids.shape[1])
    s, i, j = ((ids >= r * epr) & (ids < (r + 1) * epr)).nonzero(as_tuple=True)
    lx = ids[s, i, j] - r * epr
    order = ((lx * world + s) * max(t, 1) + i).argsort()
    return s[order], i[order]


@register
class ExpertMajorDispatch(GoldenOp):
    """`dispatch_expert_major` (cuda): dispatch every (token, expert) entry into the expert's rank, grouped by
    local expert, rows in a deterministic order.

    case.shape = [T, d], a float dtype; params as `moe_dispatch_layout`. Rank s holds x [T, d] (fresh every call),
    topk_idx [T, k] int64 (its routing rows: a multiset fixed for the case, in a fresh order of tokens and of the k
    columns every call) and counts [world, E] int32, the same on every rank and in every call: counts[s', e] = the
    entries of rank s' equal to e. Rank r's output recv_x [N_r, d], N_r = the sum of counts[:, r * epr : (r + 1) *
    epr]: for local expert l = 0 .. epr-1, then source rank s = 0 .. world-1, then token index i ascending, one row
    x_s[i] per token i of rank s that has expert r * epr + l among its top-k (a token with two experts on r appears
    twice, once in each expert's group). No padding: the groups are contiguous. nccl-tests size: the bytes of one
    rank's x; every token is stored once per expert, so the bytes written are about topk times that.
    """

    name = "ep_dispatch_expert_major"
    nccl_op = None
    functions = ("dispatch_expert_major",)

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)

    def validate_case(self, case):
        _validate_tokens_case(case)

    def make_inputs(self, case, rank, world, seed):
        t, d = (int(s) for s in case.shape)
        k = int(case.params["topk"])
        gen = generator(seed)
        x = rand([t, d], case.dtype, gen)
        rows = _public_rows(case, world, rank)
        perm = torch.randperm(t, generator=gen)
        cols = torch.rand((t, k), generator=gen).argsort(1)
        topk = rows[perm].gather(1, cols).contiguous()
        return {"x": x, "topk_idx": topk, "counts": expert_counts(case, world)}

    def expected(self, case, world, inputs):
        d = int(case.shape[1])
        epr = int(case.params["experts_per_rank"])
        topk = [inp["topk_idx"] for inp in inputs]
        xs = torch.stack([inp["x"] for inp in inputs]).view(world * int(case.shape[0]), d)
        out = []
        for r in range(world):
            srcs, toks = expert_major_order(topk, epr, r)
            out.append({"recv_x": xs[srcs * int(case.shape[0]) + toks].to(to_dtype(case.dtype))})
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params, d = _topk_size_params(perf)
        t = max(1, size_bytes // (d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t, d], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * int(case.shape[1]) * _elem(case.dtype)


__all__ = ["EpNotifyCounts", "ExpertMajorDispatch", "expert_counts", "expert_major_order", "notify_offsets"]
