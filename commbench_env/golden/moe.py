"""Expert parallelism: token dispatch/combine across the ranks that own the experts (top-1 torch tasks and the
top-k dispatch layout, dispatch and combine of kernel-level tasks), and expert weight migration."""

from __future__ import annotations

import functools

import operator

import torch

from . import register
from .base import (CandidateError, GoldenOp, elem_size as _elem, expect_tensor, generator, int_param, narrow, num_param,
                   rand, to_dtype, wide)

_int_param = functools.partial(int_param, optional=True)
_num_param = num_param


def _shared_seed(*parts: int) -> int:
    """A seed every rank (and the coordinator) derives alike from public case data."""
    s = 0x9E3779B97F4A7C15
    for p in parts:
        s = (s * 0x100000001B3 ^ (int(p) & 0xFFFF_FFFF_FFFF)) & 0x7FFF_FFFF_FFFF_FFFF
    return s


def _popularity(case, world: int) -> torch.Tensor:
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


def _rank_popularity(case, world: int, gen: torch.Generator) -> torch.Tensor:
    """One rank's expert popularity: the shared law times a private log-normal factor, so per-rank splits differ."""
    n_exp = world * int(case.params["experts_per_rank"])
    return _popularity(case, world) * torch.exp(0.75 * torch.randn(n_exp, generator=gen, dtype=torch.float64))


# ---- the row-bound expert transform of moe_dispatch_combine ---------------------------------------------------------

#: signed int64 view of splitmix64's multipliers (the row keys' finalizer)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)
#: explicit mantissa bits of each float dtype: the noise is an integer below 2 ** bits, exact in the dtype
_MANT_BITS = {torch.float64: 52, torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
#: elements per chunk of the transform on the CPU: the integer temporaries stay in cache (whole-tensor passes over
#: fresh allocations ran 10x slower at 4M elements); on a GPU one chunk
_CPU_CHUNK = 1 << 17


def _bits_dtype(dtype: torch.dtype) -> torch.dtype:
    """The integer dtype that a row's floats are read as (same element size)."""
    return {8: torch.int64, 4: torch.int32, 2: torch.int16}[torch.empty((), dtype=dtype).element_size()]


def _key_dtype(dtype: torch.dtype) -> torch.dtype:
    """Integer width of the transform's keys and noise arithmetic: int64 for float64 rows, int32 otherwise."""
    return torch.int64 if torch.empty((), dtype=dtype).element_size() == 8 else torch.int32


def _row_keys(x: torch.Tensor, mult: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """[k] int64: a keyed hash of the exact bits of every row of x [k, d]. mult [d] or [k, d] (the key dtype, odd)
    weighs each feature's bits (products wrap in the key dtype, the sum is exact mod 2**64); mix ([] or [k] int64)
    and a splitmix64 finalizer make it non-linear. Rows that differ in any bit get unrelated keys."""
    h = (x.detach().view(_bits_dtype(x.dtype)) * mult).sum(-1, dtype=torch.int64)
    h = (h ^ mix) * _MIX1
    h = (h ^ (h >> 31)) * _MIX2
    return h ^ (h >> 29)


def _noise(h: torch.Tensor, ka: torch.Tensor, kb: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Integer noise n, |n| < 2 ** _MANT_BITS[dtype], from row keys h and per-feature keys ka, kb (odd, the key dtype;
    h broadcasts against them: [k, 1] by [d], or elementwise): a keyed multiply-xorshift-multiply per element, so
    the elements of a row are unrelated to each other and to those of other rows, with no affine structure to fit.
    Integer products wrap (two's complement, on CPU and GPU alike); the coordinator runs the same code on the CPU."""
    bits = _MANT_BITS[dtype]
    if ka.dtype == torch.int64:
        z = h * ka
        z ^= z >> 32
        z *= kb
        return z >> (63 - bits)
    z = (h >> 32).to(torch.int32) * ka  # the high word: exact in int32
    z ^= z >> 16
    z *= kb
    return z >> (31 - bits)


def _expert_rows(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, mult: torch.Tensor, mix: torch.Tensor,
                 ka: torch.Tensor, kb: torch.Tensor) -> torch.Tensor:
    """The rank-side transform of one local expert, in x's dtype: x * scale + bias + noise(row) * 2**-bits."""
    bits = _MANT_BITS[x.dtype]
    y = torch.addcmul(bias, x, scale)
    n, d = int(x.shape[0]), int(x.shape[1])
    step = n if x.is_cuda else max(1, _CPU_CHUNK // max(d, 1))
    for a in range(0, n, step):
        rows = x[a:a + step]
        y[a:a + step].add_(_noise(_row_keys(rows, mult, mix)[:, None], ka, kb, x.dtype), alpha=2.0 ** -bits)
    return y


def _golden_rows(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, noise: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
    """The coordinator's float64 value of the same transform, elementwise (full and sampled checks alike)."""
    return wide(x) * scale + bias + noise.to(torch.float64) * 2.0 ** -_MANT_BITS[dtype]


def _random_keys(shape, dtype: torch.dtype, gen: torch.Generator, *, odd: bool) -> torch.Tensor:
    info = torch.iinfo(dtype)
    k = torch.randint(info.min, info.max, tuple(shape), generator=gen, dtype=torch.int64).to(dtype)
    return k | 1 if odd else k


@register
class MoeDispatchCombine(GoldenOp):
    """`moe_forward(tokens, expert_ids, expert_fn, experts_per_rank) -> y`, top-1 routing.

    Expert e lives on rank e // experts_per_rank as that rank's local expert e % experts_per_rank. The harness gives
    each rank an `expert_fn(local_index, x)` that applies that rank's SECRET transform to each row of x:
    y = x * scale[j] + bias[j] + noise_j(x) * 2**-m (per feature; m the dtype's mantissa bits), where noise_j(x) is
    a keyed hash of the exact bits of the whole row (`_row_keys`, `_noise`), |noise| < 2**m. The keys come from the
    call's own seed and stay in the harness (`secret_*` inputs are never shown to the candidate). So an expert's
    output for a row is unpredictable without handing it that very row, on its owner: probing it with other rows
    (made-up ones, the rank's own tokens) teaches nothing about any token, and its outputs cannot be condensed into
    fewer values either. y[i] is tokens[i] processed by expert expert_ids[i], in the original token order, and the
    coordinator recomputes every y[i] from the bits of tokens[i] and the owner's keys: a right y[i] is proof that
    token i reached its expert's rank unmodified and that the expert's output for it came back. This holds for the
    sampled checks of timed calls too (`expected_samples` hashes only the sampled rows).
    A second output, expert_rows, counts the rows each local expert processed: it must equal the number of tokens
    (of all ranks) routed to that expert (no padding, no probing). It is counted in the rank, so it is a contract
    check, not the security: with every y[i] right, extra rows could only have cost time.

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
        _num_param(case, "skew", default=1.0, low=0)
        _int_param(case, "routing_seed", default=0)
        _int_param(case, "idle_rank", low=0)
        _int_param(case, "empty_rank", low=0)

    def supports_world(self, world, case):
        return world >= 2 or case.params.get("idle_rank") is None

    # ---- rank side -------------------------------------------------------------------------------
    def make_inputs(self, case, rank, world, seed):
        t, d = (int(s) for s in case.shape)
        epr = int(case.params["experts_per_rank"])
        empty = case.params.get("empty_rank")
        if empty is not None and rank == int(empty) % world:
            t = 0
        gen = generator(seed)
        tokens = rand([t, d], case.dtype, gen)
        p = _rank_popularity(case, world, gen)
        if t:
            ids = torch.multinomial(p, t, replacement=True, generator=gen).to(torch.int64)
        else:
            ids = torch.empty(0, dtype=torch.int64)
        dt = to_dtype(case.dtype)
        scale = (0.5 + 1.5 * torch.rand((epr, d), generator=gen, dtype=torch.float64)).to(dt)
        bias = torch.randn((epr, d), generator=gen, dtype=torch.float64).to(dt)
        kdt = _key_dtype(dt)
        return {"tokens": tokens, "expert_ids": ids, "secret_scale": scale, "secret_bias": bias,
                "secret_row_mult": _random_keys((epr, d), kdt, gen, odd=True),
                "secret_row_mix": _random_keys((epr,), torch.int64, gen, odd=False),
                "secret_noise_keys": _random_keys((epr, 2, d), kdt, gen, odd=True)}

    def call(self, fns, inputs, case, rank, world):
        scale, bias = inputs["secret_scale"], inputs["secret_bias"]
        mult, mix, keys = inputs["secret_row_mult"], inputs["secret_row_mix"], inputs["secret_noise_keys"]
        epr, d = int(scale.shape[0]), int(scale.shape[1])
        dtype, device = inputs["tokens"].dtype, inputs["tokens"].device
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
            if x.device != device:
                raise CandidateError(f"expert_fn: x must be on {device} (where the tokens are), got {x.device}")
            rows[j] += int(x.shape[0])
            return _expert_rows(x, scale[j], bias[j], mult[j], mix[j], keys[j, 0], keys[j, 1])

        y = fns["moe_forward"](inputs["tokens"], inputs["expert_ids"], expert_fn, epr)
        return {"y": expect_tensor(y, "moe_forward's return value"),
                "expert_rows": torch.tensor(rows, dtype=torch.int64)}

    # ---- coordinator side ------------------------------------------------------------------------
    @staticmethod
    def _secrets(inputs) -> tuple[torch.Tensor, ...]:
        """Every rank's transform, stacked: scale, bias [world, epr, d] float64; row_mult [world, epr, d];
        row_mix [world, epr]; noise keys [world, epr, 2, d]."""
        return (torch.stack([wide(i["secret_scale"]) for i in inputs]),
                torch.stack([wide(i["secret_bias"]) for i in inputs]),
                torch.stack([i["secret_row_mult"] for i in inputs]),
                torch.stack([i["secret_row_mix"] for i in inputs]),
                torch.stack([i["secret_noise_keys"] for i in inputs]))

    def expected(self, case, world, inputs):
        epr = int(case.params["experts_per_rank"])
        dt = to_dtype(case.dtype)
        scale, bias, mult, mix, keys = self._secrets(inputs)
        routed = torch.zeros(world * epr, dtype=torch.int64)
        ys = []
        for inp in inputs:
            ids = inp["expert_ids"]
            o, j = ids // epr, ids % epr
            h = _row_keys(inp["tokens"], mult[o, j], mix[o, j])
            noise = _noise(h[:, None], keys[o, j, 0], keys[o, j, 1], dt)
            ys.append(narrow(_golden_rows(inp["tokens"], scale[o, j], bias[o, j], noise, dt), case.dtype))
            routed += torch.bincount(ids, minlength=world * epr)
        return [{"y": ys[r], "expert_rows": routed[r * epr:(r + 1) * epr].clone()} for r in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        """Only the sampled elements of y go through their expert's transform (only their rows are hashed)."""
        epr, d = int(case.params["experts_per_rank"]), int(case.shape[1])
        dt = to_dtype(case.dtype)
        scale, bias, mult, mix, keys = self._secrets(inputs)
        routed = sum(torch.bincount(i["expert_ids"], minlength=world * epr) for i in inputs)
        out = []
        for r, inp in enumerate(inputs):
            counts = routed[r * epr:(r + 1) * epr][pick(r, "expert_rows", epr)]  # names in sorted order
            idx = pick(r, "y", inp["tokens"].numel())
            row, col = idx // d, idx % d
            ids = inp["expert_ids"][row]
            o, j = ids // epr, ids % epr
            h = _row_keys(inp["tokens"][row], mult[o, j], mix[o, j])
            noise = _noise(h, keys[o, j, 0, col], keys[o, j, 1, col], dt)
            y = _golden_rows(inp["tokens"][row, col], scale[o, j, col], bias[o, j, col], noise, dt)
            out.append({"expert_rows": counts, "y": narrow(y, case.dtype)})
        return out

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


# ---- top-k routing for the kernel-level (cuda) expert-parallel tasks ---------------------------------------------

#: Limits the cuda references are written for: a per-expert histogram in shared memory (1024 experts at world 8)
#: and one warp lane per top-k slot.
MAX_EXPERTS_PER_RANK = 128
MAX_TOPK = 32
TOPK_PARAMS = ("experts_per_rank", "topk", "skew", "routing_seed", "drop", "target_rank", "idle_rank")


def _validate_topk_routing(case) -> None:
    """The routing params every top-k op shares (see `_topk_route`)."""
    unknown = sorted(set(case.params) - set(TOPK_PARAMS))
    if unknown:
        raise ValueError(f"unknown params {unknown} (known: {', '.join(TOPK_PARAMS)})")
    if _int_param(case, "experts_per_rank", low=1, high=MAX_EXPERTS_PER_RANK) is None:
        raise ValueError(f"params.experts_per_rank (int in [1, {MAX_EXPERTS_PER_RANK}]) is required")
    if _int_param(case, "topk", low=1, high=MAX_TOPK) is None:
        raise ValueError(f"params.topk (int in [1, {MAX_TOPK}]) is required")
    _num_param(case, "skew", default=1.0, low=0)
    _num_param(case, "drop", default=0.0, low=0, high=1)
    _int_param(case, "routing_seed", default=0)
    _int_param(case, "target_rank", low=0)
    _int_param(case, "idle_rank", low=0)


def _validate_tokens_case(case) -> None:
    """Cases of the ops that move hidden vectors: shape [tokens, hidden], a float dtype, top-k routing params."""
    if len(case.shape) != 2 or case.shape[0] < 1 or case.shape[1] < 1:
        raise ValueError(f"shape must be [tokens, hidden] with both >= 1, got {case.shape}")
    if not to_dtype(case.dtype).is_floating_point:
        raise ValueError(f"dtype must be a floating type, got {case.dtype}")
    _validate_topk_routing(case)


def _cuda_only(op: GoldenOp, card) -> None:
    if card.language.value != "cuda":
        raise ValueError(f"field 'language': op {op.name!r} passes its buffers through cb_args and serves "
                         f"language = 'cuda' tasks only")


def _repeats(ids: torch.Tensor) -> torch.Tensor:
    """[T, k] bool: the entry repeats an earlier entry of its row."""
    dup = torch.zeros(ids.shape, dtype=torch.bool)
    for j in range(1, int(ids.shape[1])):
        dup[:, j] = (ids[:, :j] == ids[:, j:j + 1]).any(1)
    return dup


def _distinct_draws(p: torch.Tensor, tokens: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """[tokens, k] int64: per row, min(k, experts with p > 0) distinct experts drawn by weight p, then -1s.

    Draws with replacement and redraws repeats (cheap for the millions of tokens of a benchmark); rows still holding
    a repeat after a few rounds take an exact weighted draw without replacement (Gumbel top-k).
    """
    ids = torch.full((tokens, k), -1, dtype=torch.int64)
    kk = min(k, int((p > 0).sum()))
    if tokens == 0 or kk == 0:
        return ids
    cur = torch.multinomial(p, tokens * kk, replacement=True, generator=gen).view(tokens, kk)
    for _ in range(4):
        dup = _repeats(cur)
        n = int(dup.sum())
        if n == 0:
            break
        cur[dup] = torch.multinomial(p, n, replacement=True, generator=gen)
    rows = _repeats(cur).any(1).nonzero().flatten()
    if rows.numel():
        u = torch.rand((rows.numel(), p.numel()), generator=gen, dtype=torch.float64).clamp_min(1e-300)
        cur[rows] = (torch.log(p) - torch.log(-torch.log(u))).topk(kk, dim=1).indices
    ids[:, :kk] = cur
    return ids


def _topk_route(case, world: int, tokens: int, gen: torch.Generator) -> torch.Tensor:
    """[tokens, topk] int64 expert ids of one rank, as a top-k router produces them (DeepEP's topk_idx).

    Distinct experts per row drawn from `_rank_popularity` (params skew, routing_seed, idle_rank); target_rank
    (optional) keeps only that rank's experts (every token goes to one rank; slots beyond its experts are -1);
    drop (default 0) masks each entry to -1 with that probability, so some tokens go nowhere.
    """
    epr, k = int(case.params["experts_per_rank"]), int(case.params["topk"])
    p = _rank_popularity(case, world, gen)
    target = case.params.get("target_rank")
    if target is not None:
        p[torch.arange(world * epr) // epr != int(target) % world] = 0.0
    ids = _distinct_draws(p, tokens, k, gen)
    drop = float(case.params.get("drop", 0.0))
    if drop > 0:
        ids[torch.rand((tokens, k), generator=gen) < drop] = -1
    return ids


def _owners(ids: torch.Tensor, epr: int) -> torch.Tensor:
    """The rank that owns each entry's expert, -1 for masked entries."""
    return torch.where(ids >= 0, ids // epr, -1)


def _rank_hits(ids: torch.Tensor, epr: int, world: int) -> torch.Tensor:
    """[T, world] bool: the token has at least one expert on the rank (DeepEP's is_token_in_rank)."""
    owner = _owners(ids, epr)
    hits = torch.zeros((int(ids.shape[0]), world + 1), dtype=torch.bool)
    hits.scatter_(1, torch.where(owner >= 0, owner, world), True)
    return hits[:, :world]


def _topk_size_params(perf) -> tuple[dict, int]:
    """Benchmark params (routing defaults filled in) and the hidden size, popped from perf.params."""
    params = dict(perf.params)
    d = int(params.pop("hidden", 7168))
    params.setdefault("experts_per_rank", 32)
    params.setdefault("topk", 8)
    return params, d


@register
class MoeDispatchLayout(GoldenOp):
    """`dispatch_layout` (cuda): the dispatch layout of one rank's top-k routing, as DeepEP's get_dispatch_layout.

    case.shape = [T] (tokens per rank), case.dtype = int64; params: experts_per_rank and topk (required) and the
    routing params of `_topk_route`. Input topk_idx [T, topk] int64: expert ids in [0, E), E = world *
    experts_per_rank, distinct within a row, or -1 (no expert); expert e lives on rank e // experts_per_rank.
    Outputs: is_token_in_rank [T, world] bool; tokens_per_rank [world] int32 (tokens with at least one expert on
    the rank, counted once); tokens_per_expert [E] int32; send_slot [T, world] int32: the token's position among
    the tokens this rank sends to that rank (exclusive prefix sum of is_token_in_rank down the column), -1 where
    it sends nothing. nccl-tests size: the bytes of topk_idx.
    """

    name = "moe_dispatch_layout"
    nccl_op = None
    functions = ("dispatch_layout",)

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)

    def validate_case(self, case):
        if len(case.shape) != 1 or case.shape[0] < 1:
            raise ValueError(f"shape must be [tokens] with tokens >= 1, got {case.shape}")
        if case.dtype != "int64":
            raise ValueError(f"dtype must be int64 (the dtype of topk_idx), got {case.dtype}")
        _validate_topk_routing(case)

    def make_inputs(self, case, rank, world, seed):
        return {"topk_idx": _topk_route(case, world, int(case.shape[0]), generator(seed))}

    def expected(self, case, world, inputs):
        epr = int(case.params["experts_per_rank"])
        out = []
        for inp in inputs:
            ids = inp["topk_idx"]
            hits = _rank_hits(ids, epr, world)
            slot = torch.where(hits, torch.cumsum(hits.to(torch.int32), 0, dtype=torch.int32) - 1, -1)
            out.append({"is_token_in_rank": hits,
                        "tokens_per_rank": hits.sum(0, dtype=torch.int32),
                        "tokens_per_expert": torch.bincount(ids[ids >= 0], minlength=world * epr).to(torch.int32),
                        "send_slot": slot.to(torch.int32)})
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params, _ = _topk_size_params(perf)
        t = max(1, size_bytes // (int(params["topk"]) * 8))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t], dtype="int64", params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * int(case.params["topk"]) * 8


@register
class MoeDispatchTokens(GoldenOp):
    """`dispatch` (cuda): send every token to each rank that hosts one of its top-k experts (DeepEP intranode dispatch).

    case.shape = [T, d] (tokens per rank, hidden size), a float dtype; params as `moe_dispatch_layout`. Rank s holds
    x [T, d] and topk_idx [T, topk] int64. Rank r receives, in the order (source rank s, then token index i), every
    token i of every rank s that has at least one expert on r, once. Outputs of rank r, with capacity C = world * T
    rows and n = the number of tokens it receives:
    recv_x [C, d]: rows < n the received tokens, rows >= n zero; recv_src_idx [C] int32: the token index i of each
    received row, -1 from n on; recv_topk_idx [C, topk] int32: per received row, the token's top-k ids made local
    to r (e - r * experts_per_rank for experts on r, else -1), -1 rows from n on; recv_counts [world] int32: tokens
    received from each source rank; recv_tokens_per_expert [experts_per_rank] int32: received tokens per local
    expert. nccl-tests size: the bytes of one rank's x.
    """

    name = "moe_dispatch_tokens"
    nccl_op = None
    functions = ("dispatch",)

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)

    def validate_case(self, case):
        _validate_tokens_case(case)

    def make_inputs(self, case, rank, world, seed):
        t, d = (int(s) for s in case.shape)
        gen = generator(seed)
        x = rand([t, d], case.dtype, gen)
        return {"x": x, "topk_idx": _topk_route(case, world, t, gen)}

    def expected(self, case, world, inputs):
        t, d = (int(s) for s in case.shape)
        epr, k = int(case.params["experts_per_rank"]), int(case.params["topk"])
        cap = world * t
        out = []
        for r in range(world):
            recv_x = torch.zeros((cap, d), dtype=to_dtype(case.dtype))
            src = torch.full((cap,), -1, dtype=torch.int32)
            local = torch.full((cap, k), -1, dtype=torch.int32)
            counts = torch.zeros(world, dtype=torch.int32)
            per_expert = torch.zeros(epr, dtype=torch.int64)
            n = 0
            for s, inp in enumerate(inputs):
                ids = inp["topk_idx"]
                mine = _owners(ids, epr) == r
                idx = mine.any(1).nonzero().flatten()
                m = int(idx.numel())
                recv_x[n:n + m] = inp["x"][idx]
                src[n:n + m] = idx.to(torch.int32)
                local[n:n + m] = torch.where(mine, ids - r * epr, -1)[idx].to(torch.int32)
                counts[s] = m
                per_expert += torch.bincount(ids[mine] - r * epr, minlength=epr)
                n += m
            out.append({"recv_x": recv_x, "recv_src_idx": src, "recv_topk_idx": local, "recv_counts": counts,
                        "recv_tokens_per_expert": per_expert.to(torch.int32)})
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params, d = _topk_size_params(perf)
        t = max(1, size_bytes // (d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t, d], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * int(case.shape[1]) * _elem(case.dtype)


@register
class MoeCombineTopk(GoldenOp):
    """`combine` (cuda): weighted top-k combine of expert outputs that live on the experts' ranks (DeepEP combine).

    case.shape = [T, d], a float dtype; params as `moe_dispatch_layout`. The routing is shared: every rank and the
    coordinator derive all ranks' topk_idx from public case data (routing_seed, world, shape), because each rank's
    expert outputs are laid out by everybody's routing. An entry (s, i, j) is slot j of token i of rank s; its
    expert e = topk_idx_s[i, j] (skipped when -1) lives on rank r = e // experts_per_rank, whose expert_out holds
    one row per entry routed to r, in the order (s, i, j). Inputs of rank s: expert_out [R_s, d] (its rows, from its
    own seed), topk_idx [T, topk] int64, topk_weights [T, topk] float32 (own seed; also set for masked entries, which
    must be ignored), rank_offsets [world, world] int32: rank_offsets[s', r] = the row of r's expert_out where the
    entries of rank s' begin (the same on every rank). Output combined_x [T, d]: row i = sum over valid j of
    topk_weights[i, j] * (the expert_out row of entry (s, i, j)); zero for tokens routed nowhere.
    nccl-tests size: the expert rows one rank gathers, T * topk * d elements.
    """

    name = "moe_combine_topk"
    nccl_op = None
    functions = ("combine",)

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)

    def validate_case(self, case):
        _validate_tokens_case(case)

    def routing(self, case, world: int) -> list[torch.Tensor]:
        """Every rank's topk_idx, from public case data alone."""
        t = int(case.shape[0])
        epr, k = int(case.params["experts_per_rank"]), int(case.params["topk"])
        base = (0xC0B1E, int(case.params.get("routing_seed", 0)), world, t, k, epr)
        return [_topk_route(case, world, t, generator(_shared_seed(*base, s))) for s in range(world)]

    @staticmethod
    def rank_offsets(routes: list[torch.Tensor], epr: int, world: int) -> torch.Tensor:
        counts = torch.stack([torch.bincount(_owners(ids, epr)[ids >= 0], minlength=world) for ids in routes])
        return (torch.cumsum(counts, 0) - counts).to(torch.int32)  # [source, owner]

    def make_inputs(self, case, rank, world, seed):
        t, d = (int(s) for s in case.shape)
        epr, k = int(case.params["experts_per_rank"]), int(case.params["topk"])
        routes = self.routing(case, world)
        rows = sum(int((_owners(ids, epr) == rank).sum()) for ids in routes)
        gen = generator(seed)
        return {"expert_out": rand([rows, d], case.dtype, gen), "topk_idx": routes[rank],
                "topk_weights": torch.rand((t, k), generator=gen, dtype=torch.float32),
                "rank_offsets": self.rank_offsets(routes, epr, world)}

    def expected(self, case, world, inputs):
        t, d = (int(s) for s in case.shape)
        epr = int(case.params["experts_per_rank"])
        out = []
        for s, inp in enumerate(inputs):
            ids, w = inp["topk_idx"], wide(inp["topk_weights"])
            owner = _owners(ids, epr)
            flat = owner.reshape(-1)
            rows = torch.full_like(flat, -1)
            for r in range(world):
                sel = flat == r
                rows[sel] = int(inp["rank_offsets"][s, r]) + torch.arange(int(sel.sum()))
            rows = rows.view_as(owner)
            y = torch.zeros((t, d), dtype=torch.float64)
            for j in range(int(ids.shape[1])):
                for r in range(world):
                    sel = owner[:, j] == r
                    if bool(sel.any()):
                        y[sel] += w[sel, j, None] * wide(inputs[r]["expert_out"][rows[sel, j]])
            out.append({"combined_x": narrow(y, case.dtype)})
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params, d = _topk_size_params(perf)
        t = max(1, size_bytes // (int(params["topk"]) * d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t, d], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * int(case.params["topk"]) * int(case.shape[1]) * _elem(case.dtype)
