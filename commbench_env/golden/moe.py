"""Expert parallelism: token dispatch/combine across the ranks that own the experts, and expert weight migration."""

from __future__ import annotations

import operator

import torch

from . import register
from .base import CandidateError, GoldenOp, expect_tensor, generator, narrow, rand, to_dtype, wide


def _int_param(case, key: str, *, default=None, low: int | None = None):
    v = case.params.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"params.{key} must be an integer, got {v!r}")
    if low is not None and v < low:
        raise ValueError(f"params.{key} must be >= {low}, got {v}")
    return v


def _shared_seed(*parts: int) -> int:
    """A seed every rank (and the coordinator) derives alike from public case data."""
    s = 0x9E3779B97F4A7C15
    for p in parts:
        s = (s * 0x100000001B3 ^ (int(p) & 0xFFFF_FFFF_FFFF)) & 0x7FFF_FFFF_FFFF_FFFF
    return s


def _elem(dtype: str) -> int:
    return torch.empty((), dtype=to_dtype(dtype)).element_size()


@register
class MoeDispatchCombine(GoldenOp):
    """`moe_forward(tokens, expert_ids, expert_fn, experts_per_rank) -> y`, top-1 routing.

    Expert e lives on rank e // experts_per_rank as that rank's local expert e % experts_per_rank. The harness gives
    each rank an `expert_fn(local_index, x)` that applies that rank's SECRET affine transform
    y = x * scale[local_index] + bias[local_index] (per feature), so a token is right only if it was processed by the
    rank that owns its expert. y[i] is tokens[i] processed by expert expert_ids[i], in the original token order.
    A second output, expert_rows, counts the rows each local expert processed: it must equal the number of tokens
    (of all ranks) routed to that expert, so experts run on exactly their tokens (no padding, no probing).

    case.shape = [T, d] (tokens per rank, hidden size); params:
      experts_per_rank (int >= 1, required), skew (float >= 0, default 1: Zipf exponent of expert popularity),
      routing_seed (int, default 0: which experts are popular; shared by all ranks),
      idle_rank (int, optional: the experts of rank idle_rank % world get no tokens at all),
      empty_rank (int, optional: rank empty_rank % world has no tokens, T = 0).
    """

    name = "moe_dispatch_combine"
    nccl_op = "alltoall"
    functions = ("moe_forward",)

    def validate_case(self, case):
        if len(case.shape) != 2 or case.shape[0] < 1 or case.shape[1] < 1:
            raise ValueError(f"shape must be [tokens, hidden] with both >= 1, got {case.shape}")
        if not to_dtype(case.dtype).is_floating_point:
            raise ValueError(f"dtype must be a floating type, got {case.dtype}")
        if _int_param(case, "experts_per_rank", low=1) is None:
            raise ValueError("params.experts_per_rank (int >= 1) is required")
        skew = case.params.get("skew", 1.0)
        if isinstance(skew, bool) or not isinstance(skew, (int, float)) or skew < 0:
            raise ValueError(f"params.skew must be a number >= 0, got {skew!r}")
        _int_param(case, "routing_seed", default=0)
        _int_param(case, "idle_rank", low=0)
        _int_param(case, "empty_rank", low=0)

    def supports_world(self, world, case):
        return world >= 2 or case.params.get("idle_rank") is None

    # ---- rank side -------------------------------------------------------------------------------
    def _popularity(self, case, world: int) -> torch.Tensor:
        """Expert popularity shared by every rank: Zipf over a seeded permutation, idle rank zeroed."""
        epr = int(case.params["experts_per_rank"])
        n_exp = world * epr
        g = generator(_shared_seed(int(case.params.get("routing_seed", 0)), world, epr))
        rank_of = torch.randperm(n_exp, generator=g).to(torch.float64)
        p = (1.0 + rank_of) ** (-float(case.params.get("skew", 1.0)))
        idle = case.params.get("idle_rank")
        if idle is not None:
            owner = torch.arange(n_exp) // epr
            p[owner == int(idle) % world] = 0.0
        return p

    def make_inputs(self, case, rank, world, seed):
        t, d = (int(s) for s in case.shape)
        epr = int(case.params["experts_per_rank"])
        empty = case.params.get("empty_rank")
        if empty is not None and rank == int(empty) % world:
            t = 0
        gen = generator(seed)
        tokens = rand([t, d], case.dtype, gen)
        # each rank skews the shared popularity a little more, so per-rank splits differ too
        p = self._popularity(case, world) * torch.exp(0.75 * torch.randn(world * epr, generator=gen, dtype=torch.float64))
        if t:
            ids = torch.multinomial(p, t, replacement=True, generator=gen).to(torch.int64)
        else:
            ids = torch.empty(0, dtype=torch.int64)
        dt = to_dtype(case.dtype)
        scale = (0.5 + 1.5 * torch.rand((epr, d), generator=gen, dtype=torch.float64)).to(dt)
        bias = torch.randn((epr, d), generator=gen, dtype=torch.float64).to(dt)
        return {"tokens": tokens, "expert_ids": ids, "secret_scale": scale, "secret_bias": bias}

    def call(self, fns, inputs, case, rank, world):
        scale, bias = inputs["secret_scale"], inputs["secret_bias"]
        epr, d = int(scale.shape[0]), int(scale.shape[1])
        dtype = inputs["tokens"].dtype
        rows = [0] * epr  # rows each local expert processed: exactly its routed tokens, no padding or probes

        def expert_fn(local_expert_index, x):
            try:
                j = operator.index(local_expert_index)
            except TypeError:
                raise CandidateError(f"expert_fn: local_expert_index must be an int, got "
                                     f"{type(local_expert_index).__name__}") from None
            if not 0 <= j < epr:
                raise CandidateError(f"expert_fn: local_expert_index {j} is out of range; this rank owns "
                                     f"{epr} expert(s), local indices 0..{epr - 1}")
            x = expect_tensor(x, "expert_fn's argument x")
            if x.dim() != 2 or int(x.shape[1]) != d:
                raise CandidateError(f"expert_fn: x must have shape [k, {d}], got {list(x.shape)}")
            if x.dtype != dtype:
                raise CandidateError(f"expert_fn: x must have dtype {dtype}, got {x.dtype}")
            rows[j] += int(x.shape[0])
            return torch.addcmul(bias[j], x, scale[j])

        y = fns["moe_forward"](inputs["tokens"], inputs["expert_ids"], expert_fn, epr)
        return {"y": expect_tensor(y, "moe_forward's return value"),
                "expert_rows": torch.tensor(rows, dtype=torch.int64)}

    # ---- coordinator side ------------------------------------------------------------------------
    def expected(self, case, world, inputs):
        epr = int(case.params["experts_per_rank"])
        scale = torch.stack([wide(i["secret_scale"]) for i in inputs])  # [world, epr, d]
        bias = torch.stack([wide(i["secret_bias"]) for i in inputs])
        routed = torch.zeros(world * epr, dtype=torch.int64)
        ys = []
        for inp in inputs:
            ids = inp["expert_ids"]
            owner, local = ids // epr, ids % epr
            ys.append(narrow(wide(inp["tokens"]) * scale[owner, local] + bias[owner, local], case.dtype))
            routed += torch.bincount(ids, minlength=world * epr)
        return [{"y": ys[r], "expert_rows": routed[r * epr:(r + 1) * epr].clone()} for r in range(world)]

    # ---- benchmark -------------------------------------------------------------------------------
    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = dict(perf.params)
        d = int(params.pop("hidden", 256))
        params.setdefault("experts_per_rank", 2)
        t = max(1, size_bytes // (d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t, d], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        """Bytes of one rank's token tensor: what it dispatches (and gets back)."""
        return int(case.shape[0]) * int(case.shape[1]) * _elem(case.dtype)


@register
class ExpertRebalance(GoldenOp):
    """`rebalance(weights, old_placement, new_placement) -> new_weights`: migrate expert weights to a new placement.

    There are E = world * k experts. A placement is an int64 tensor [world, k]; placement[r, j] is the expert held in
    slot j of rank r, and each placement is a permutation of 0..E-1. weights[j] on rank r are the weights of expert
    old_placement[r, j]; rank r must return new_weights[j] = the weights of expert new_placement[r, j].

    case.shape = [k, *expert_shape]; params: placement_seed (int, required; shared by all ranks),
    swaps (int >= 0, optional: the new placement is the old one with that many random transpositions; without it,
    an independent random permutation).
    """

    name = "expert_rebalance"
    nccl_op = None
    functions = ("rebalance",)

    def validate_case(self, case):
        if len(case.shape) < 1 or case.shape[0] < 1 or any(s < 1 for s in case.shape):
            raise ValueError(f"shape must be [experts_per_rank, *expert_shape] with every size >= 1, got {case.shape}")
        if _int_param(case, "placement_seed") is None:
            raise ValueError("params.placement_seed (int) is required: every rank derives the placements from it")
        _int_param(case, "swaps", low=0)

    def placements(self, case, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = int(case.shape[0])
        n_exp = world * k
        g = generator(_shared_seed(int(case.params["placement_seed"]), world, k))
        old = torch.randperm(n_exp, generator=g)
        swaps = case.params.get("swaps")
        if swaps is None:
            new = torch.randperm(n_exp, generator=g)
        else:
            new = old.clone()
            for _ in range(int(swaps)):
                a, b = (int(v) for v in torch.randint(0, n_exp, (2,), generator=g))
                new[a], new[b] = new[b].clone(), new[a].clone()
        return old.reshape(world, k), new.reshape(world, k)

    def make_inputs(self, case, rank, world, seed):
        old, new = self.placements(case, world)
        return {"weights": rand(case.shape, case.dtype, generator(seed), low=-1000, high=1000),
                "old_placement": old, "new_placement": new}

    def call(self, fns, inputs, case, rank, world):
        y = fns["rebalance"](inputs["weights"], inputs["old_placement"], inputs["new_placement"])
        return {"new_weights": expect_tensor(y, "rebalance's return value")}

    def expected(self, case, world, inputs):
        old, new = inputs[0]["old_placement"], inputs[0]["new_placement"]
        bank = torch.empty((world * int(case.shape[0]), *case.shape[1:]), dtype=inputs[0]["weights"].dtype)
        bank[old.reshape(-1)] = torch.cat([i["weights"] for i in inputs])
        return [{"new_weights": bank[new[r]].clone()} for r in range(world)]

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = dict(perf.params)
        d = int(params.pop("hidden", 1024))
        params.setdefault("placement_seed", 0)
        k = max(1, size_bytes // (d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[k, d], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        """Bytes of one rank's expert weights (what a full reshuffle moves per rank)."""
        n = 1
        for s in case.shape:
            n *= int(s)
        return n * _elem(case.dtype)
