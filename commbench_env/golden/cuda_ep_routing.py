"""Golden semantics of two kernel-level expert-parallel tasks: a fused router (softmax top-k routing together with
the dispatch layout it implies) and a dispatch that quantises tokens to fp8 e4m3 on the way."""

from __future__ import annotations

import torch

from . import register
from .base import GoldenOp, generator, int_param, num_param, rand, to_dtype
from .compare import compare_tensor
from .moe import (MAX_EXPERTS_PER_RANK, MAX_TOPK, MoeDispatchTokens, _cuda_only, _elem, _owners, _shared_seed,
                  _topk_route, _topk_size_params, _validate_topk_routing)

# ---- ep/router_topk_layout -------------------------------------------------------------------------------------

ROUTER_DTYPES = ("float32", "bfloat16", "float16")
ROUTER_PARAMS = ("experts_per_rank", "topk", "normalize", "scale", "grid", "skew", "idle_rank", "routing_seed",
                 "tie_rows")
#: rows of logits ranked at a time in `expected` (bounds the coordinator's memory at benchmark sizes)
_ROUTER_CHUNK = 8192


def _ordered_keys(logits: torch.Tensor) -> torch.Tensor:
    """[T, E] int64 keys whose order is (logit descending, expert index ascending), all distinct: the float32 bits
    of each logit mapped to an unsigned order (negative values flipped), times 2048, plus 2047 - index."""
    u = logits.to(torch.float32).view(torch.int32).to(torch.int64) & 0xFFFF_FFFF
    ordered = torch.where(u >= (1 << 31), 0xFFFF_FFFF - u, u + (1 << 31))
    idx = torch.arange(int(logits.shape[1]), dtype=torch.int64)
    return ordered * 2048 + (2047 - idx)


def _top_experts(rows: torch.Tensor, k: int) -> torch.Tensor:
    """[T, k] int64: per row the first k experts by (logit descending, index ascending). torch.topk's order among
    equal values is unspecified, so rows with a tie inside the top k or at its edge are ranked again by exact keys."""
    n_exp = int(rows.shape[1])
    vals, sel = rows.to(torch.float32).topk(min(k + 1, n_exp), dim=1, sorted=True)
    tie = (vals[:, 1:k] == vals[:, :k - 1]).any(1) if k > 1 else torch.zeros(int(rows.shape[0]), dtype=torch.bool)
    if k < n_exp:
        tie |= vals[:, k - 1] == vals[:, k]
    sel = sel[:, :k].clone()
    if bool(tie.any()):
        sel[tie] = _ordered_keys(rows[tie]).topk(k, dim=1, sorted=True).indices
    return sel


@register
class RouterTopkLayout(GoldenOp):
    """`router_topk_layout` (cuda): softmax top-k routing of one rank's tokens and the dispatch layout it implies.

    case.shape = [T] (tokens of every rank), case.dtype = the logits' dtype (float32, bfloat16, float16); there are
    E = world * experts_per_rank experts, expert e on rank e // experts_per_rank. Input logits [T, E], finite, never
    -0.0. Outputs:
    topk_idx [T, k] int64: the first k experts of the row ordered by logit descending, equal logits by index
    ascending; topk_weights [T, k] (the logits' dtype): the softmax over all E logits of each chosen expert, or with
    normalize = 1 those values divided by their sum over the row's k experts (= the softmax of the k chosen logits);
    is_token_in_rank [T, world] bool; tokens_per_rank [world] int32 (tokens with an expert on the rank);
    tokens_per_expert [E] int32 (tokens that chose the expert).

    params: experts_per_rank, topk (1..32, at most E), normalize (0 or 1, default 1); the logits: N(0, scale**2)
    (scale default 1), rounded to multiples of grid when grid > 0 (ties), plus a bias shared by every rank of
    -skew * log(1 + popularity rank) per expert (routing_seed picks the order), the experts of idle_rank % world
    lowered by 1000 (they are chosen only when k exceeds the other experts), and a share tie_rows of rows whose
    logits are all equal. nccl-tests size: the bytes of the logits.
    """

    name = "router_topk_layout"
    nccl_op = None
    functions = ("router_topk_layout",)

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)
        low = min(card.world.sizes)
        for i, case in enumerate(card.cases):
            if int(case.params["topk"]) > low * int(case.params["experts_per_rank"]):
                raise ValueError(f"field 'cases.{i}' ({case.name}): topk exceeds the experts at world {low}")

    def validate_case(self, case):
        if len(case.shape) != 1 or case.shape[0] < 1:
            raise ValueError(f"shape must be [tokens] with tokens >= 1, got {case.shape}")
        if case.dtype not in ROUTER_DTYPES:
            raise ValueError(f"dtype must be one of {ROUTER_DTYPES} (the logits' dtype), got {case.dtype}")
        unknown = sorted(set(case.params) - set(ROUTER_PARAMS))
        if unknown:
            raise ValueError(f"unknown params {unknown} (known: {', '.join(ROUTER_PARAMS)})")
        if int_param(case, "experts_per_rank", low=1, high=MAX_EXPERTS_PER_RANK, optional=True) is None:
            raise ValueError(f"params.experts_per_rank (int in [1, {MAX_EXPERTS_PER_RANK}]) is required")
        if int_param(case, "topk", low=1, high=MAX_TOPK, optional=True) is None:
            raise ValueError(f"params.topk (int in [1, {MAX_TOPK}]) is required")
        int_param(case, "normalize", default=1, low=0, high=1)
        num_param(case, "scale", 1.0, low=1e-3, high=100.0)
        num_param(case, "grid", 0.0, low=0.0, high=10.0)
        num_param(case, "skew", 0.0, low=0.0, high=10.0)
        num_param(case, "tie_rows", 0.0, low=0.0, high=1.0)
        int_param(case, "routing_seed", default=0)
        int_param(case, "idle_rank", low=0, optional=True)

    def supports_world(self, world, case):
        return world * int(case.params["experts_per_rank"]) >= int(case.params["topk"])

    def make_inputs(self, case, rank, world, seed):
        t = int(case.shape[0])
        epr = int(case.params["experts_per_rank"])
        n_exp = world * epr
        gen = generator(seed)
        logits = rand([t, n_exp], "float32", gen) * float(case.params.get("scale", 1.0))
        grid = float(case.params.get("grid", 0.0))
        if grid > 0:
            logits = torch.round(logits / grid) * grid
        skew = float(case.params.get("skew", 0.0))
        idle = case.params.get("idle_rank")
        if skew > 0 or idle is not None:
            g = generator(_shared_seed(0x207E, int(case.params.get("routing_seed", 0)), world, epr))
            bias = -skew * torch.log1p(torch.randperm(n_exp, generator=g).to(torch.float32))
            if idle is not None:
                bias[torch.arange(n_exp) // epr == int(idle) % world] -= 1000.0
            logits += bias
        share = float(case.params.get("tie_rows", 0.0))
        if share > 0:
            rows = torch.rand(t, generator=gen) < share
            logits[rows] = logits[rows, :1]
        x = logits.to(to_dtype(case.dtype))
        return {"logits": x + 0.0}  # + 0.0: no negative zeros (they equal +0.0 but have other bits)

    def expected(self, case, world, inputs):
        epr, k = int(case.params["experts_per_rank"]), int(case.params["topk"])
        norm = int(case.params.get("normalize", 1)) == 1
        n_exp = world * epr
        out = []
        for inp in inputs:
            logits = inp["logits"]
            t = int(logits.shape[0])
            idx = torch.empty((t, k), dtype=torch.int64)
            w = torch.empty((t, k), dtype=torch.float64)
            for a in range(0, t, _ROUTER_CHUNK):
                rows = logits[a:a + _ROUTER_CHUNK]
                sel = _top_experts(rows, k)
                top = rows.gather(1, sel).to(torch.float64)
                p = torch.exp(top - top[:, :1])  # the first chosen logit is the row's maximum
                if norm:
                    p = p / p.sum(1, keepdim=True)
                else:
                    p = p / torch.exp(rows.to(torch.float64) - top[:, :1]).sum(1, keepdim=True)
                idx[a:a + _ROUTER_CHUNK], w[a:a + _ROUTER_CHUNK] = sel, p
            hits = torch.zeros((t, world), dtype=torch.bool)
            hits.scatter_(1, idx // epr, True)
            out.append({"topk_idx": idx, "topk_weights": w, "is_token_in_rank": hits,
                        "tokens_per_rank": hits.sum(0, dtype=torch.int32),
                        "tokens_per_expert": torch.bincount(idx.reshape(-1), minlength=n_exp).to(torch.int32)})
        return out

    def size_case(self, perf, size_bytes, world):
        """A size is the bytes of one rank's logits; params.experts is E whatever the world (default 256)."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        n_exp = int(params.pop("experts", 256))
        params["experts_per_rank"] = max(1, n_exp // world)
        params.setdefault("topk", 8)
        e = params["experts_per_rank"] * world
        t = max(1, size_bytes // (e * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * world * int(case.params["experts_per_rank"]) * _elem(case.dtype)


# ---- ep/fp8_dispatch ---------------------------------------------------------------------------------------------

FP8_MAX = 448.0  # the largest finite e4m3 (e4m3fn) value
FP8_BLOCK = 128  # channels per scale
#: the float32 nearest to 1e-4 (bits 0x38D1B717, what C's 1e-4f is): amax is clamped to it before dividing
AMAX_FLOOR = torch.tensor(1e-4, dtype=torch.float32)
REL_BOUND = 1.0 / 16  # |code * scale - x| <= |x| / 16 + scale / 1000
ABS_BOUND = 1.0 / 1000
FP8_DTYPES = ("float32", "bfloat16", "float16")
FP8_PARAMS = ("spread", "zero_blocks", "outliers", "grid")
_FINITE = {torch.float32: 3.0e38, torch.bfloat16: 3.0e38, torch.float16: 6.0e4}


def fp8_blocks(d: int) -> int:
    return -(-d // FP8_BLOCK)


def fp8_quantise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract's quantisation of rows x [T, d]: scales float32 [T, nb], scale = max(amax, 1e-4f) / 448 (a
    float32 division, correctly rounded) over each block of 128 channels (the last one shorter when 128 does not
    divide d), and the e4m3 codes [T, d] uint8 of x / scale rounded to nearest even (the golden choice; any code
    within the bound passes)."""
    t, d = (int(s) for s in x.shape)
    nb = fp8_blocks(d)
    xf = torch.zeros((t, nb * FP8_BLOCK), dtype=torch.float32)
    xf[:, :d] = x.to(torch.float32)
    xb = xf.view(t, nb, FP8_BLOCK)
    scale = (torch.maximum(xb.abs().amax(-1), AMAX_FLOOR).to(torch.float64) / FP8_MAX).to(torch.float32)  # exact
    q = (xb / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return q.view(t, nb * FP8_BLOCK)[:, :d].contiguous(), scale


def fp8_decode(codes: torch.Tensor) -> torch.Tensor:
    """e4m3fn codes (uint8) as float64; the NaN codes 0x7F and 0xFF decode to NaN."""
    return codes.contiguous().view(torch.float8_e4m3fn).to(torch.float64)


@register
class MoeDispatchFp8(MoeDispatchTokens):
    """`dispatch` (cuda): `moe_dispatch_tokens` whose payload is quantised to fp8 e4m3 with one float32 scale per
    128 channels of each token, on the way.

    Rank r's outputs, C = world * T rows, n the tokens it receives, in the order of `moe_dispatch_tokens`:
    recv_x [C, d] uint8: rows < n the e4m3 codes of the received tokens, rows >= n zero bytes;
    recv_scales [C, nb] float32 (nb = ceil(d / 128)): rows < n the scales of `fp8_quantise` (exact: the rule is a
    float32 division), rows >= n 0.0. The buffer is declared int32 (its bits) because the judge allocates float
    outputs in the case's dtype; `verify` reads it as float32. recv_src_idx, recv_topk_idx, recv_counts as
    `moe_dispatch_tokens` (recv_tokens_per_expert is not an output here). A code is right when |decode(code) *
    scale - x| <= |x| / 16 + scale / 1000 (round to nearest in e4m3 meets it with room to spare; rounding toward
    zero, a saturated code, a scale shared by the whole token, or a NaN code does not).

    Inputs: x = N(0, 1) times 10 ** U(-spread, spread) per (token, block) (spread default 2), a share `outliers`
    of values times 50 (default 0.001), a share zero_blocks of (token, block) pairs all zero (default 0.02);
    topk_idx as `moe_dispatch_tokens`. With grid = true (benchmark sizes) x holds e4m3 values times a power of two
    per block, with 448 times it in every block: then every correct code is the golden one, which the sampled
    checks of timed calls compare byte for byte.
    """

    name = "moe_dispatch_fp8"
    nccl_op = None
    functions = ("dispatch",)

    def validate_case(self, case):
        if len(case.shape) != 2 or case.shape[0] < 1 or case.shape[1] < 1:
            raise ValueError(f"shape must be [tokens, hidden] with both >= 1, got {case.shape}")
        if case.dtype not in FP8_DTYPES:
            raise ValueError(f"dtype must be one of {FP8_DTYPES}, got {case.dtype}")
        routing = case.model_copy(update={"params": {k: v for k, v in case.params.items() if k not in FP8_PARAMS}})
        _validate_topk_routing(routing)
        num_param(case, "spread", 2.0, low=0.0, high=6.0)
        num_param(case, "zero_blocks", 0.02, low=0.0, high=1.0)
        num_param(case, "outliers", 0.001, low=0.0, high=1.0)
        g = case.params.get("grid", False)
        if not isinstance(g, bool):
            raise ValueError(f"params.grid must be true or false, got {g!r}")

    def make_inputs(self, case, rank, world, seed):
        t, d = (int(s) for s in case.shape)
        dt = to_dtype(case.dtype)
        gen = generator(seed)
        x = rand([t, d], "float32", gen)
        topk = _topk_route(case, world, t, gen)
        nb = fp8_blocks(d)
        if case.params.get("grid", False):
            c = (x * 64.0).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)
            heads = torch.arange(nb) * FP8_BLOCK
            sign = torch.where(torch.rand((t, nb), generator=gen) < 0.5, -1.0, 1.0)
            c[:, heads] = FP8_MAX * sign  # every block's amax is 448 times its power of two
            p = torch.randint(-3, 4, (t, nb), generator=gen).to(torch.float32)
            x = c * torch.exp2(p).repeat_interleave(FP8_BLOCK, dim=1)[:, :d]
        else:
            spread = float(case.params.get("spread", 2.0))
            mag = torch.pow(10.0, (torch.rand((t, nb), generator=gen) * 2 - 1) * spread)
            zero = torch.rand((t, nb), generator=gen) < float(case.params.get("zero_blocks", 0.02))
            mag[zero] = 0.0
            x = x * mag.repeat_interleave(FP8_BLOCK, dim=1)[:, :d]
            share = float(case.params.get("outliers", 0.001))
            if share > 0:
                x[torch.rand((t, d), generator=gen) < share] *= 50.0
            lim = _FINITE[dt]
            x = x.clamp(-lim, lim)
        return {"x": x.to(dt) + 0.0, "topk_idx": topk}  # + 0.0: no negative zeros

    def _received(self, case, world, inputs):
        """Per receiving rank: (source rows [n] as (source, index) lists, local top-k ids, counts)."""
        epr = int(case.params["experts_per_rank"])
        per = []
        for r in range(world):
            parts = []
            for s, inp in enumerate(inputs):
                ids = inp["topk_idx"]
                mine = _owners(ids, epr) == r
                idx = mine.any(1).nonzero().flatten()
                parts.append((s, idx, torch.where(mine, ids - r * epr, -1)[idx].to(torch.int32)))
            per.append(parts)
        return per

    def expected(self, case, world, inputs):
        t, d = (int(s) for s in case.shape)
        k = int(case.params["topk"])
        cap, nb = world * t, fp8_blocks(d)
        quant = [fp8_quantise(inp["x"]) for inp in inputs]
        out = []
        for parts in self._received(case, world, inputs):
            codes = torch.zeros((cap, d), dtype=torch.uint8)
            scales = torch.zeros((cap, nb), dtype=torch.float32)
            src = torch.full((cap,), -1, dtype=torch.int32)
            local = torch.full((cap, k), -1, dtype=torch.int32)
            counts = torch.zeros(world, dtype=torch.int32)
            n = 0
            for s, idx, loc in parts:
                m = int(idx.numel())
                codes[n:n + m] = quant[s][0][idx]
                scales[n:n + m] = quant[s][1][idx]
                src[n:n + m] = idx.to(torch.int32)
                local[n:n + m] = loc
                counts[s] = m
                n += m
            out.append({"recv_x": codes, "recv_scales": scales.view(torch.int32), "recv_src_idx": src,
                        "recv_topk_idx": local, "recv_counts": counts})
        return out

    def verify(self, case, world, inputs, outputs, tol):
        t, d = (int(s) for s in case.shape)
        exp = self.expected(case, world, inputs)
        received = self._received(case, world, inputs)
        for r, (e, got) in enumerate(zip(exp, outputs)):
            def fail(name, **m):
                return {"case": case.name, "rank": r, "output": name, **m}

            for name in ("recv_src_idx", "recv_topk_idx", "recv_counts", "recv_x", "recv_scales"):
                g = got.get(name)
                if g is None:
                    return fail(name, reason="missing", detail=f"rank {r} returned no output {name!r}")
                if tuple(g.shape) != tuple(e[name].shape) or g.dtype != e[name].dtype:
                    return fail(name, reason="shape", expected=f"{e[name].dtype} {list(e[name].shape)}",
                                got=f"{g.dtype} {list(g.shape)}")
            for name in ("recv_src_idx", "recv_topk_idx", "recv_counts"):
                m = compare_tensor(e[name], got[name], (0.0, 0.0))
                if m:
                    return fail(name, **m)
            n = int(e["recv_counts"].sum())
            s_exp = e["recv_scales"].view(torch.float32)
            s_got = got["recv_scales"].contiguous().view(torch.float32)
            bad = e["recv_scales"] != got["recv_scales"]
            if bool(bad.any()):
                row, blk = (int(i) for i in bad.nonzero()[0])
                what = ("scale of a received row: max(amax, 1e-4f) / 448 over channels "
                        f"[{blk * FP8_BLOCK}, {min(d, (blk + 1) * FP8_BLOCK)}) of the token, a float32 division"
                        if row < n else f"row {row} >= n = {n}: the scales of rows past the received ones are 0.0")
                return fail("recv_scales", reason="nan" if bool(torch.isnan(s_got[row, blk])) else "value",
                            index=[row, blk], expected=repr(float(s_exp[row, blk])), got=repr(float(s_got[row, blk])),
                            wrong_count=int(bad.sum()), total_count=int(bad.numel()), detail=what)
            codes = got["recv_x"]
            tail = codes[n:] != 0
            if bool(tail.any()):
                row, col = (int(i) for i in tail.nonzero()[0])
                return fail("recv_x", reason="value", index=[n + row, col], expected="0", got=str(int(codes[n + row, col])),
                            wrong_count=int(tail.sum()), total_count=int(tail.numel()),
                            detail=f"rows past the n = {n} received ones must be zero bytes")
            if n == 0:
                continue
            x = torch.cat([inputs[s]["x"][idx] for s, idx, _ in received[r]])
            x = x.to(torch.float64)
            scale = s_exp[:n].to(torch.float64).repeat_interleave(FP8_BLOCK, dim=1)[:, :d]
            deq = fp8_decode(codes[:n]) * scale
            err = (deq - x).abs()
            allowed = x.abs() * REL_BOUND + scale * ABS_BOUND
            wrong = ~(err <= allowed)  # NaN codes are wrong too
            if bool(wrong.any()):
                row, col = (int(i) for i in wrong.nonzero()[0])
                nan = bool(torch.isnan(deq[row, col]))
                return fail("recv_x", reason="nan" if nan else "value", index=[row, col],
                            expected=repr(float(x[row, col])), got=repr(float(deq[row, col])),
                            abs_error=None if nan else float(err[row, col]),
                            rel_error=None if nan or float(x[row, col]) == 0 else float(err[row, col] / x[row, col].abs()),
                            wrong_count=int(wrong.sum()), total_count=int(wrong.numel()),
                            detail=(f"code {int(codes[row, col])} decodes to {float(deq[row, col] / scale[row, col])!r}"
                                    f", times the row's scale {float(scale[row, col])!r}; allowed |error| <= |x| / 16 "
                                    f"+ scale / 1000 = {float(allowed[row, col])!r}"))
        return None

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params, d = _topk_size_params(perf)
        params.setdefault("grid", True)
        t = max(1, size_bytes // (d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t, d], dtype=perf.dtype, params=params)


__all__ = ["RouterTopkLayout", "MoeDispatchFp8", "fp8_quantise", "fp8_decode", "fp8_blocks"]
