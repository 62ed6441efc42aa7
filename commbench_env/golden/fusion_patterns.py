"""Golden semantics of the first task wave (issue #22): fusion_patterns.

Parallel-training building blocks that mix communication with compute: context-parallel (ring) attention,
Ulysses all-to-all attention, a sequence-parallel tensor-parallel MLP block, a ZeRO-1 AdamW step, an FSDP forward
over sharded layers and a global gradient-norm clip. Every rank's inputs come from its own seed; tensors that are
replicated on every rank (a norm weight, the parameters of ZeRO) come from a seed derived from public case data.
"""

from __future__ import annotations

import functools
import math

import torch

from . import register
from .base import (CandidateError, GoldenOp, bool_param, elem_size as _elem, expect_tensor, generator, int_param,
                   narrow, num_param, rand, to_dtype, wide)

_int_param = functools.partial(int_param, optional=True)
_num_param = num_param
_bool_param = bool_param


# ---- parameter helpers -------------------------------------------------------------------------------------------


def _known_params(case, known: set[str]) -> None:
    unknown = set(case.params) - known
    if unknown:
        raise ValueError(f"unknown params {sorted(unknown)} (known: {', '.join(sorted(known))})")


def _float_dtype(case) -> None:
    if not to_dtype(case.dtype).is_floating_point:
        raise ValueError(f"dtype must be a floating type, got {case.dtype}")


def _shared_seed(*parts: int) -> int:
    """A seed every rank (and the coordinator) derives alike from public case data."""
    s = 0x9E3779B97F4A7C15
    for p in parts:
        s = (s * 0x100000001B3 ^ (int(p) & 0xFFFF_FFFF_FFFF)) & 0x7FFF_FFFF_FFFF_FFFF
    return s


@functools.lru_cache(maxsize=8)
def _shared_rand(seed: int, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    """A replicated tensor, drawn once per (seed, shape, dtype): every rank of every call holds the same one."""
    return rand(list(shape), dtype, generator(seed))


def _what(res) -> str:
    """What a candidate returned instead of a tuple, for its error message."""
    return type(res).__name__ + (f" of {len(res)}" if isinstance(res, (tuple, list)) else "")


def _cast(t64: torch.Tensor, dtype: str) -> torch.Tensor:
    return t64.to(to_dtype(dtype))


# ---- attention (ring and Ulysses) ----------------------------------------------------------------------------------
def _attend(q: torch.Tensor, qpos: torch.Tensor, heads: torch.Tensor, k_parts: list[torch.Tensor],
            v_parts: list[torch.Tensor], causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of single (query row, head) pairs, in float64: q [U, D] (the query vectors), qpos [U] their global
    positions, heads [U] the kv head each reads; k_parts, v_parts the ranks' [n_r, Hkv, D] blocks in sequence
    order. Returns the outputs [U, D] and the log-sum-exp of each pair's scaled scores [U]. Only the kv heads in
    use are assembled, one [S, D] slice at a time."""
    u, d = int(q.shape[0]), int(q.shape[1])
    out = torch.zeros((u, d), dtype=torch.float64)
    lse = torch.zeros(u, dtype=torch.float64)
    if u == 0:
        return out, lse
    kpos = torch.arange(sum(int(p.shape[0]) for p in k_parts))
    for kvh in torch.unique(heads).tolist():
        sel = (heads == kvh).nonzero().view(-1)
        kk = torch.cat([wide(p[:, kvh, :]) for p in k_parts])
        vv = torch.cat([wide(p[:, kvh, :]) for p in v_parts])
        scores = (wide(q[sel]) @ kk.T) / math.sqrt(d)
        if causal:
            scores = scores.masked_fill(kpos[None, :] > qpos[sel][:, None], float("-inf"))
        out[sel] = torch.softmax(scores, dim=1) @ vv
        lse[sel] = torch.logsumexp(scores, dim=1)
    return out, lse


def _attention_rows(world: int, inputs, lens: list[int], causal: bool, picks=None, lse_picks=None):
    """Per rank, the expected output [n_r, H, D] and log-sum-exp [n_r, H] (picks None), or their values at the flat
    positions picks[r] and lse_picks[r] (lse_picks None: no log-sum-exp)."""
    k_parts, v_parts = [i["k"] for i in inputs], [i["v"] for i in inputs]
    heads, dim = int(inputs[0]["q"].shape[1]), int(inputs[0]["q"].shape[2])
    group = heads // int(k_parts[0].shape[1])
    starts = [sum(lens[:r]) for r in range(world)]

    def pairs_at(r: int, row: torch.Tensor, head: torch.Tensor):
        pairs, where = torch.unique(row * heads + head, return_inverse=True)
        prow, phead = pairs // heads, pairs % heads
        o, l = _attend(inputs[r]["q"][prow, phead], starts[r] + prow, phead // group, k_parts, v_parts, causal)
        return o, l, where

    outs, lses = [], []
    for r in range(world):
        n = lens[r]
        idx = torch.arange(n * heads * dim) if picks is None else picks[r]
        o, _, where = pairs_at(r, idx // (heads * dim), (idx // dim) % heads)
        flat = o[where, idx % dim]
        outs.append(flat.view(n, heads, dim) if picks is None else flat)
        if picks is None or lse_picks is not None:
            li = torch.arange(n * heads) if picks is None else lse_picks[r]
            _, l, where = pairs_at(r, li // heads, li % heads)
            lses.append(l[where].view(n, heads) if picks is None else l[where])
    return outs, lses


def _attention_flops(lens: list[int], heads: int, dim: int, causal: bool, world: int) -> float:
    s = sum(lens)
    pairs = s * (s + 1) / 2 if causal else s * s
    return 4.0 * pairs * heads * dim / world


class _AttentionOp(GoldenOp):
    """What the attention ops share: benchmark cases of one query block per rank, and its bytes as the metric."""

    bench_heads: int = 8
    bench_head_dim: int = 64

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is one rank's query block, n * heads * head_dim elements."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        heads = int(params.pop("heads", self.bench_heads))
        dim = int(params.pop("head_dim", self.bench_head_dim))
        n = max(1, size_bytes // (heads * dim * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[n, heads, dim], dtype=perf.dtype,
                        params=params)

    def metric_bytes(self, case, world):
        n, heads, dim = (int(s) for s in case.shape)
        return n * heads * dim * _elem(case.dtype)


@register
class RingAttention(_AttentionOp):
    """`ring_attention(q, k, v, seq_lens, causal) -> out`: context-parallel attention over sequence blocks.

    case.shape = [n, H, D]: n tokens per rank (before params.last_len / ragged_seed), H query heads, head dim D.
    Rank r holds the positions sum(seq_lens[:r]) .. + seq_lens[r] - 1 of one sequence: q [n_r, H, D] and k, v
    [n_r, Hkv, D] (grouped-query attention: query head h reads kv head h // (H / Hkv)). It returns (out, lse): out
    [n_r, H, D] = softmax(q k^T / sqrt(D), masked causally when `causal`) v for its own queries against the whole
    sequence, and lse [n_r, H] the log-sum-exp of each query's scaled, masked scores.
    params: kv_heads (default H, divides H), causal (default true), last_len (the last rank's length instead of
    n, may be 0), ragged_seed (every rank's length drawn in [0, n] from this shared seed instead), q_scale (queries
    are N(0,1) * q_scale: large logits), key_drift (rank s's keys are shifted by key_drift * s).
    """

    name = "ring_attention"
    nccl_op = None
    functions = ("ring_attention",)
    PARAMS = {"kv_heads", "causal", "last_len", "ragged_seed", "q_scale", "key_drift"}

    def validate_case(self, case):
        if len(case.shape) != 3 or case.shape[0] < 0 or case.shape[1] < 1 or case.shape[2] < 1:
            raise ValueError(f"shape must be [tokens_per_rank, heads, head_dim] with heads, head_dim >= 1, got "
                             f"{case.shape}")
        _float_dtype(case)
        _known_params(case, self.PARAMS)
        kvh = _int_param(case, "kv_heads", default=case.shape[1], low=1)
        if case.shape[1] % kvh:
            raise ValueError(f"params.kv_heads = {kvh} must divide the {case.shape[1]} query heads")
        _bool_param(case, "causal", default=True)
        _int_param(case, "last_len", low=0)
        _int_param(case, "ragged_seed")
        _num_param(case, "q_scale", default=1.0, low=0)
        _num_param(case, "key_drift", default=0.0)

    def seq_lens(self, case, world: int) -> list[int]:
        n = int(case.shape[0])
        ragged = case.params.get("ragged_seed")
        if ragged is not None:
            g = generator(_shared_seed(int(ragged), world, n, 7))
            return [int(x) for x in torch.randint(0, n + 1, (world,), generator=g)]
        lens = [n] * world
        if case.params.get("last_len") is not None:
            lens[-1] = int(case.params["last_len"])
        return lens

    def make_inputs(self, case, rank, world, seed):
        n = self.seq_lens(case, world)[rank]
        _, heads, dim = (int(s) for s in case.shape)
        kvh = int(case.params.get("kv_heads", heads))
        g = generator(seed)
        q = rand([n, heads, dim], torch.float64, g) * float(case.params.get("q_scale", 1.0))
        k = rand([n, kvh, dim], torch.float64, g) + float(case.params.get("key_drift", 0.0)) * rank
        v = rand([n, kvh, dim], torch.float64, g)
        return {"q": _cast(q, case.dtype), "k": _cast(k, case.dtype), "v": _cast(v, case.dtype)}

    def call(self, fns, inputs, case, rank, world):
        causal = bool(case.params.get("causal", True))
        res = fns["ring_attention"](inputs["q"], inputs["k"], inputs["v"], self.seq_lens(case, world), causal)
        if not isinstance(res, (tuple, list)) or len(res) != 2:
            raise CandidateError("ring_attention must return a tuple (out, lse) of two tensors, got " + _what(res))
        return {"out": expect_tensor(res[0], "ring_attention(...)[0] (out)"),
                "lse": expect_tensor(res[1], "ring_attention(...)[1] (lse)")}

    def expected(self, case, world, inputs):
        outs, lses = _attention_rows(world, inputs, self.seq_lens(case, world), bool(case.params.get("causal", True)))
        return [{"out": narrow(o, case.dtype), "lse": narrow(l, case.dtype)} for o, l in zip(outs, lses)]

    def expected_samples(self, case, world, inputs, pick):
        lens = self.seq_lens(case, world)
        _, heads, dim = (int(s) for s in case.shape)
        lse_picks, picks = [], []
        for r in range(world):  # names in sorted order within a rank: lse, then out
            lse_picks.append(pick(r, "lse", lens[r] * heads))
            picks.append(pick(r, "out", lens[r] * heads * dim))
        outs, lses = _attention_rows(world, inputs, lens, bool(case.params.get("causal", True)), picks, lse_picks)
        return [{"lse": narrow(l, case.dtype), "out": narrow(o, case.dtype)} for o, l in zip(outs, lses)]

    def flops(self, case, world):
        _, heads, dim = (int(s) for s in case.shape)
        return _attention_flops(self.seq_lens(case, world), heads, dim, bool(case.params.get("causal", True)), world)


@register
class UlyssesAttention(_AttentionOp):
    """`ulysses_attention(q, k, v, causal) -> out`: attention over a sequence split evenly over ranks.

    case.shape = [n, H, D]: every rank holds n consecutive positions (rank r: r*n .. r*n + n - 1) of q, k, v
    [n, H, D] (H heads, any number: not necessarily a multiple of the world size, possibly fewer than the ranks)
    and returns out [n, H, D] = softmax(q k^T / sqrt(D), causal mask when `causal`) v for its own queries against
    the whole sequence. params: causal (default false), q_scale (queries N(0,1) * q_scale).
    """

    name = "ulysses_attention"
    bench_heads, bench_head_dim = 32, 128
    nccl_op = None
    functions = ("ulysses_attention",)
    PARAMS = {"causal", "q_scale"}

    def validate_case(self, case):
        if len(case.shape) != 3 or any(int(s) < 1 for s in case.shape):
            raise ValueError(f"shape must be [tokens_per_rank, heads, head_dim], all >= 1, got {case.shape}")
        _float_dtype(case)
        _known_params(case, self.PARAMS)
        _bool_param(case, "causal", default=False)
        _num_param(case, "q_scale", default=1.0, low=0)

    def make_inputs(self, case, rank, world, seed):
        shape = [int(s) for s in case.shape]
        g = generator(seed)
        q = rand(shape, torch.float64, g) * float(case.params.get("q_scale", 1.0))
        k, v = rand(shape, torch.float64, g), rand(shape, torch.float64, g)
        return {"q": _cast(q, case.dtype), "k": _cast(k, case.dtype), "v": _cast(v, case.dtype)}

    def call(self, fns, inputs, case, rank, world):
        out = fns["ulysses_attention"](inputs["q"], inputs["k"], inputs["v"], bool(case.params.get("causal", False)))
        return {"out": expect_tensor(out, "ulysses_attention's return value")}

    def expected(self, case, world, inputs):
        lens = [int(case.shape[0])] * world
        outs, _ = _attention_rows(world, inputs, lens, bool(case.params.get("causal", False)))
        return [{"out": narrow(x, case.dtype)} for x in outs]

    def expected_samples(self, case, world, inputs, pick):
        n, heads, dim = (int(s) for s in case.shape)
        picks = [pick(r, "out", n * heads * dim) for r in range(world)]
        outs, _ = _attention_rows(world, inputs, [n] * world, bool(case.params.get("causal", False)), picks)
        return [{"out": narrow(x, case.dtype)} for x in outs]

    def flops(self, case, world):
        n, heads, dim = (int(s) for s in case.shape)
        return _attention_flops([n] * world, heads, dim, bool(case.params.get("causal", False)), world)


# ---- tensor-parallel MLP block with sequence parallelism ------------------------------------------------------------
@register
class TpMlpBlock(GoldenOp):
    """`tp_mlp_block(x, norm_weight, w1, w2, eps) -> y`: a sequence-parallel, tensor-parallel pre-norm MLP block.

    case.shape = [n, d, f]. Rank r holds x_r [n, d] (rows r*n .. r*n + n - 1 of the activations X [W*n, d]), the
    norm weight g [d] (the same on every rank), w1_r [d, f] (columns r*f .. of W1 = cat(w1_s, dim=1), [d, W*f])
    and w2_r [f, d] (rows r*f .. of W2 = cat(w2_s, dim=0), [W*f, d]). It returns its rows of
    Y = X + gelu(rmsnorm(X) @ W1) @ W2, with rmsnorm(X) = X / sqrt(mean(X^2, last dim) + eps) * g and gelu the exact
    (erf) one. params: eps (default 1e-5), x_scale (X is N(0,1) * x_scale, default 1), shared_seed (the norm
    weight's, default 0).
    """

    name = "tp_mlp_block"
    nccl_op = None
    functions = ("tp_mlp_block",)
    PARAMS = {"eps", "x_scale", "shared_seed"}

    def validate_case(self, case):
        if len(case.shape) != 3 or any(int(s) < 1 for s in case.shape):
            raise ValueError(f"shape must be [tokens_per_rank, hidden, ffn_per_rank], all >= 1, got {case.shape}")
        _float_dtype(case)
        _known_params(case, self.PARAMS)
        _num_param(case, "eps", default=1e-5, low=1e-12)
        _num_param(case, "x_scale", default=1.0, low=0)
        _int_param(case, "shared_seed", default=0)

    @staticmethod
    def eps(case) -> float:
        return float(case.params.get("eps", 1e-5))

    def norm_weight(self, case, world: int) -> torch.Tensor:
        d = int(case.shape[1])
        seed = _shared_seed(int(case.params.get("shared_seed", 0)), world, d, 31)
        return (1.0 + 0.25 * _shared_rand(seed, (d,), "float64")).to(to_dtype(case.dtype))

    def make_inputs(self, case, rank, world, seed):
        n, d, f = (int(s) for s in case.shape)
        g = generator(seed)
        x = rand([n, d], torch.float64, g) * float(case.params.get("x_scale", 1.0))
        w1 = rand([d, f], torch.float64, g) / math.sqrt(d)
        w2 = rand([f, d], torch.float64, g) / math.sqrt(world * f)
        return {"x": _cast(x, case.dtype), "norm_weight": self.norm_weight(case, world).clone(),
                "w1": _cast(w1, case.dtype), "w2": _cast(w2, case.dtype)}

    def call(self, fns, inputs, case, rank, world):
        y = fns["tp_mlp_block"](inputs["x"], inputs["norm_weight"], inputs["w1"], inputs["w2"], self.eps(case))
        return {"y": expect_tensor(y, "tp_mlp_block's return value")}

    def _rows(self, case, inputs, rows: torch.Tensor) -> torch.Tensor:
        """Rows `rows` (global indices) of Y, in float64."""
        n = int(case.shape[0])
        x = torch.zeros((rows.numel(), int(case.shape[1])), dtype=torch.float64)
        for r in torch.unique(rows // n).tolist():  # only the rows asked for, from their owners
            sel = (rows // n == r).nonzero().view(-1)
            x[sel] = wide(inputs[r]["x"][rows[sel] - r * n])
        h = x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + self.eps(case)) * wide(inputs[0]["norm_weight"])
        w1 = torch.cat([wide(i["w1"]) for i in inputs], dim=1)
        w2 = torch.cat([wide(i["w2"]) for i in inputs], dim=0)
        return x + torch.nn.functional.gelu(h @ w1) @ w2

    def expected(self, case, world, inputs):
        n = int(case.shape[0])
        y = self._rows(case, inputs, torch.arange(world * n))
        return [{"y": narrow(y[r * n:(r + 1) * n].clone(), case.dtype)} for r in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        n, d, _ = (int(s) for s in case.shape)
        out = []
        for r in range(world):
            idx = pick(r, "y", n * d)
            rows, where = torch.unique(idx // d, return_inverse=True)
            out.append({"y": narrow(self._rows(case, inputs, r * n + rows)[where, idx % d], case.dtype)})
        return out

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is one rank's activation shard x, n * d elements."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        d, f = int(params.pop("d", 512)), int(params.pop("f", 256))
        n = max(1, size_bytes // (d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[n, d, f], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        n, d, _ = (int(s) for s in case.shape)
        return n * d * _elem(case.dtype)

    def flops(self, case, world):
        n, d, f = (int(s) for s in case.shape)
        return 4.0 * world * n * d * f  # the two matmuls over the whole sequence, on this rank's ffn shard


# ---- ZeRO-1 AdamW step --------------------------------------------------------------------------------------------
def _shard_range(numel: int, world: int, rank: int) -> tuple[int, int]:
    """Rank `rank`'s slice of a flat vector of `numel` elements: chunks of ceil(numel / world), the last shorter or
    empty."""
    c = -(-numel // world) if numel else 0
    return min(numel, rank * c), min(numel, (rank + 1) * c)


@register
class Zero1AdamStep(GoldenOp):
    """`zero1_step(params, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay)`.

    case.shape = [N]. Every rank holds the same params [N] (replicated, from params.shared_seed), its own gradient
    grad [N] and the AdamW state of the slice it owns (`_shard_range`): exp_avg, exp_avg_sq [len_r]. With g the
    mean over ranks of grad, each slice is updated by AdamW (torch.optim.AdamW's formula, `step` the step count
    after this update); every rank returns (params' [N], exp_avg' [len_r], exp_avg_sq' [len_r]).
    params: lr (1e-3), beta1 (0.9), beta2 (0.999), eps (1e-8), weight_decay (0.01), step (int >= 1, default 10),
    grad_scale (gradients N(0,1) * grad_scale, default 1), shared_seed (0).
    """

    name = "zero1_adamw_step"
    nccl_op = "all_reduce"  # a reduce-scatter and an all-gather of the vector: an all-reduce's bus traffic
    functions = ("zero1_step",)
    DEFAULTS = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}

    def validate_case(self, case):
        if len(case.shape) != 1 or case.shape[0] < 1:
            raise ValueError(f"shape must be [N] with N >= 1, got {case.shape}")
        if case.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {case.dtype}")
        _known_params(case, set(self.DEFAULTS) | {"step", "grad_scale", "shared_seed"})
        _num_param(case, "lr", default=1e-3, low=0)
        for key in ("beta1", "beta2"):
            _num_param(case, key, default=self.DEFAULTS[key], low=0, high=0.999999)
        _num_param(case, "eps", default=1e-8, low=1e-12)
        _num_param(case, "weight_decay", default=0.01, low=0)
        _int_param(case, "step", default=10, low=1)
        _num_param(case, "grad_scale", default=1.0, low=0)
        _int_param(case, "shared_seed", default=0)

    def hyper(self, case) -> dict:
        h = {k: float(case.params.get(k, v)) for k, v in self.DEFAULTS.items()}
        h["step"] = int(case.params.get("step", 10))
        return h

    def params_of(self, case, world: int) -> torch.Tensor:
        numel = int(case.shape[0])
        seed = _shared_seed(int(case.params.get("shared_seed", 0)), world, numel, 53)
        return _shared_rand(seed, (numel,), case.dtype)

    def make_inputs(self, case, rank, world, seed):
        numel = int(case.shape[0])
        a, b = _shard_range(numel, world, rank)
        g = generator(seed)
        grad = rand([numel], torch.float64, g) * float(case.params.get("grad_scale", 1.0))
        m = rand([b - a], torch.float64, g) * 0.05
        v = (rand([b - a], torch.float64, g) * 0.05) ** 2
        return {"params": self.params_of(case, world).clone(), "grad": _cast(grad, case.dtype),
                "exp_avg": _cast(m, case.dtype), "exp_avg_sq": _cast(v, case.dtype)}

    def call(self, fns, inputs, case, rank, world):
        h = self.hyper(case)
        res = fns["zero1_step"](inputs["params"], inputs["grad"], inputs["exp_avg"], inputs["exp_avg_sq"], h["step"],
                                h["lr"], h["beta1"], h["beta2"], h["eps"], h["weight_decay"])
        if not isinstance(res, (tuple, list)) or len(res) != 3:
            raise CandidateError("zero1_step must return a tuple (params, exp_avg, exp_avg_sq) of three tensors, got "
                                 + _what(res))
        names = ("params", "exp_avg", "exp_avg_sq")
        return {n: expect_tensor(t, f"zero1_step(...)[{i}] ({n})") for i, (n, t) in enumerate(zip(names, res))}

    def expected(self, case, world, inputs):
        h = self.hyper(case)
        numel = int(case.shape[0])
        gmean = torch.stack([wide(i["grad"]) for i in inputs]).sum(0) / world
        p = wide(inputs[0]["params"]).clone()
        states = []
        bc1, bc2 = 1 - h["beta1"] ** h["step"], 1 - h["beta2"] ** h["step"]
        for r in range(world):
            a, b = _shard_range(numel, world, r)
            g = gmean[a:b]
            m = h["beta1"] * wide(inputs[r]["exp_avg"]) + (1 - h["beta1"]) * g
            v = h["beta2"] * wide(inputs[r]["exp_avg_sq"]) + (1 - h["beta2"]) * g * g
            upd = (m / bc1) / (torch.sqrt(v / bc2) + h["eps"])
            p[a:b] = p[a:b] * (1 - h["lr"] * h["weight_decay"]) - h["lr"] * upd
            states.append((m, v))
        return [{"params": narrow(p, case.dtype), "exp_avg": narrow(m, case.dtype), "exp_avg_sq": narrow(v, case.dtype)}
                for m, v in states]

    def _update(self, case, world, inputs, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(new params, m, v) at flat parameter positions idx, from the owners' states, in float64."""
        h = self.hyper(case)
        numel = int(case.shape[0])
        c = -(-numel // world)
        owner, local = idx // c, idx % c
        g = sum(wide(i["grad"][idx]) for i in inputs) / world
        m0 = torch.zeros(idx.numel(), dtype=torch.float64)
        v0 = torch.zeros(idx.numel(), dtype=torch.float64)
        for r in range(world):
            sel = owner == r
            m0[sel] = wide(inputs[r]["exp_avg"][local[sel]])
            v0[sel] = wide(inputs[r]["exp_avg_sq"][local[sel]])
        m = h["beta1"] * m0 + (1 - h["beta1"]) * g
        v = h["beta2"] * v0 + (1 - h["beta2"]) * g * g
        upd = (m / (1 - h["beta1"] ** h["step"])) / (torch.sqrt(v / (1 - h["beta2"] ** h["step"])) + h["eps"])
        p = wide(inputs[0]["params"][idx]) * (1 - h["lr"] * h["weight_decay"]) - h["lr"] * upd
        return p, m, v

    def expected_samples(self, case, world, inputs, pick):
        """Only the sampled positions are reduced and updated (no [world, N] stack of the gradients)."""
        numel = int(case.shape[0])
        out = []
        for r in range(world):
            a, b = _shard_range(numel, world, r)
            ia = pick(r, "exp_avg", b - a)  # names in sorted order: exp_avg, exp_avg_sq, params
            iv = pick(r, "exp_avg_sq", b - a)
            ip = pick(r, "params", numel)
            _, m, _ = self._update(case, world, inputs, a + ia)
            _, _, v = self._update(case, world, inputs, a + iv)
            p, _, _ = self._update(case, world, inputs, ip)
            out.append({"exp_avg": narrow(m, case.dtype), "exp_avg_sq": narrow(v, case.dtype),
                        "params": narrow(p, case.dtype)})
        return out

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is the parameter vector, N elements."""
        from ..cards import CaseSpec

        n = max(1, size_bytes // _elem(perf.dtype))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[n], dtype=perf.dtype,
                        params=dict(perf.params))

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * _elem(case.dtype)


# ---- FSDP forward over sharded layers -------------------------------------------------------------------------------
@register
class FsdpForward(GoldenOp):
    """`fsdp_forward(x, weight_shards, dims) -> y`: a stack of bias-free linear layers whose weights are sharded.

    case.shape = [n, d_0, d_1, ..., d_L]: every rank holds its own batch x [n, d_0] and, for each layer l, a flat
    shard [c_l] of the weight W_l [d_l, d_{l+1}]: W_l flattened row-major, zero-padded to world * c_l elements with
    c_l = ceil(d_l * d_{l+1} / world), rank r holding elements r*c_l .. (r+1)*c_l - 1 (each rank's values are its
    own). It returns h_L [n, d_L], with h_0 = x, h_{l+1} = relu(h_l @ W_l) for l < L - 1 and h_L = h_{L-1} @ W_{L-1}.
    """

    name = "fsdp_forward"
    nccl_op = "all_gather"
    functions = ("fsdp_forward",)

    def validate_case(self, case):
        if len(case.shape) < 3 or int(case.shape[0]) < 0 or any(int(s) < 1 for s in case.shape[1:]):
            raise ValueError(f"shape must be [tokens, d_0, d_1, ..., d_L] with L >= 1 and every width >= 1, got "
                             f"{case.shape}")
        _float_dtype(case)
        _known_params(case, set())

    @staticmethod
    def dims(case) -> list[int]:
        return [int(s) for s in case.shape[1:]]

    def make_inputs(self, case, rank, world, seed):
        n, dims = int(case.shape[0]), self.dims(case)
        g = generator(seed)
        out = {"x": _cast(rand([n, dims[0]], torch.float64, g), case.dtype)}
        for l in range(len(dims) - 1):
            numel = dims[l] * dims[l + 1]
            c = -(-numel // world)
            shard = rand([c], torch.float64, g) * math.sqrt(2.0 / dims[l])
            valid = max(0, min(c, numel - rank * c))
            shard[valid:] = 0.0  # the padding past the weight's last element
            out[f"w{l}"] = _cast(shard, case.dtype)
        return out

    def call(self, fns, inputs, case, rank, world):
        dims = self.dims(case)
        shards = [inputs[f"w{l}"] for l in range(len(dims) - 1)]
        return {"y": expect_tensor(fns["fsdp_forward"](inputs["x"], shards, list(dims)), "fsdp_forward's return value")}

    def weights(self, case, inputs) -> list[torch.Tensor]:
        dims = self.dims(case)
        ws = []
        for l in range(len(dims) - 1):
            flat = torch.cat([wide(i[f"w{l}"]) for i in inputs])
            ws.append(flat[:dims[l] * dims[l + 1]].view(dims[l], dims[l + 1]))
        return ws

    def forward(self, x: torch.Tensor, ws: list[torch.Tensor]) -> torch.Tensor:
        h = wide(x)
        for l, w in enumerate(ws):
            h = h @ w
            if l < len(ws) - 1:
                h = torch.relu(h)
        return h

    def expected(self, case, world, inputs):
        ws = self.weights(case, inputs)
        return [{"y": narrow(self.forward(i["x"], ws), case.dtype)} for i in inputs]

    def expected_samples(self, case, world, inputs, pick):
        d_out = self.dims(case)[-1]
        n = int(case.shape[0])
        ws = self.weights(case, inputs)
        out = []
        for r in range(world):
            idx = pick(r, "y", n * d_out)
            rows, where = torch.unique(idx // d_out, return_inverse=True)
            out.append({"y": narrow(self.forward(inputs[r]["x"][rows], ws)[where, idx % d_out], case.dtype)})
        return out

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is all layers' full weights: `layers` square layers of width d = sqrt(size / layers)."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        layers, tokens = int(params.pop("layers", 4)), int(params.pop("tokens", 512))
        d = max(1, math.isqrt(size_bytes // (layers * _elem(perf.dtype))))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[tokens] + [d] * (layers + 1),
                        dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        dims = self.dims(case)
        return sum(dims[l] * dims[l + 1] for l in range(len(dims) - 1)) * _elem(case.dtype)

    def flops(self, case, world):
        dims = self.dims(case)
        return 2.0 * int(case.shape[0]) * sum(dims[l] * dims[l + 1] for l in range(len(dims) - 1))


# ---- global gradient-norm clipping --------------------------------------------------------------------------------
#: the tolerance (rtol, atol) of the returned norm for float32 and bfloat16 gradients (float64 ones use the card's):
#: a norm accumulated in bfloat16 is off by up to 4e-3 (the result's own rounding), one accumulated in float32 by
#: 1e-7 with pairwise sums and by 3e-5 with torch.linalg.vector_norm's sequential sums over 1M CPU elements
NORM_TOL = (1e-4, 1e-6)
CLIP_EPS = 1e-6


@register
class GradNormClip(GoldenOp):
    """`clip_grad_norm(grads, max_norm, all_reduce) -> (clipped, total_norm)`: global-norm clipping of sharded grads.

    Every rank holds its own list of gradient shards (the shards of all ranks are disjoint pieces of one model's
    gradients); total_norm = sqrt(sum of squares of every element of every rank's shards), and every shard is
    multiplied by min(1, max_norm / (total_norm + 1e-6)). The judge's `all_reduce` (an in-place sum) must be called
    exactly once per rank. case.shape = [n_tensors, max_len]: each rank draws from its own seed how many shards it
    holds (1 .. n_tensors) and their shapes (1-D or 2-D, 0 .. max_len elements per dim).
    params: max_norm (required), grad_scale (gradients N(0,1) * grad_scale, default 1), mixed (odd-numbered shards
    are float32 while the others have the case dtype), empty_rank (that rank's shards have no elements at all).
    """

    name = "grad_norm_clip"
    nccl_op = None
    functions = ("clip_grad_norm",)
    harness_collectives = frozenset({"allreduce"})

    def validate_case(self, case):
        if len(case.shape) != 2 or case.shape[0] < 1 or case.shape[1] < 0:
            raise ValueError(f"shape must be [n_tensors, max_len] with n_tensors >= 1, got {case.shape}")
        if case.dtype not in ("float32", "float64", "bfloat16", "float16"):
            raise ValueError(f"dtype must be a floating type, got {case.dtype}")
        _known_params(case, {"max_norm", "grad_scale", "mixed", "empty_rank", "bench"})
        if "max_norm" not in case.params:
            raise ValueError("params.max_norm is required")
        _num_param(case, "max_norm", default=1.0, low=0)
        _num_param(case, "grad_scale", default=1.0, low=0)
        _bool_param(case, "mixed", default=False)
        _int_param(case, "empty_rank", low=0)

    def _shapes(self, case, rank: int, world: int, g: torch.Generator) -> list[list[int]]:
        n, max_len = (int(s) for s in case.shape)
        if case.params.get("bench"):  # 4 weight-like shards and 4 small bias-like ones, n elements in all
            bias = max(1, n // 1024)
            w = max(1, (n - 4 * bias) // 4)
            return [[w], [bias]] * 4
        empty = case.params.get("empty_rank")
        if empty is not None and rank == int(empty) % world:
            return [[0], [max_len, 0]]  # shards without elements: the rank still takes part
        count = int(torch.randint(1, n + 1, (1,), generator=g))
        shapes = []
        for _ in range(count):
            nd = int(torch.randint(1, 3, (1,), generator=g))
            shapes.append([int(x) for x in torch.randint(0, max_len + 1, (nd,), generator=g)])
        return shapes

    def dtype_of(self, case, i: int) -> str:
        return "float32" if case.params.get("mixed") and i % 2 else case.dtype

    def make_inputs(self, case, rank, world, seed):
        g = generator(seed)
        scale = float(case.params.get("grad_scale", 1.0))
        return {f"g{i}": _cast(rand(s, torch.float64, g) * scale, self.dtype_of(case, i))
                for i, s in enumerate(self._shapes(case, rank, world, g))}

    def call(self, fns, inputs, case, rank, world):
        import torch.distributed as dist

        from .utility import _counting_all_reduce

        grads = [inputs[f"g{i}"] for i in range(len(inputs))]
        reduce_fn, stats = _counting_all_reduce(dist.group.WORLD)
        res = fns["clip_grad_norm"](grads, float(case.params["max_norm"]), reduce_fn)
        if not isinstance(res, (tuple, list)) or len(res) != 2:
            raise CandidateError("clip_grad_norm must return a tuple (clipped, total_norm), got " + _what(res))
        clipped, norm = res
        if not isinstance(clipped, (list, tuple)) or len(clipped) != len(grads):
            raise CandidateError(f"clip_grad_norm(...)[0] must be a list of {len(grads)} tensors (one per shard), got "
                                 + _what(clipped))
        out = {f"g{i}": expect_tensor(t, f"clip_grad_norm(...)[0][{i}]") for i, t in enumerate(clipped)}
        out["norm"] = expect_tensor(norm, "clip_grad_norm(...)[1] (total_norm)")
        out["calls"] = torch.tensor(stats, dtype=torch.int64)
        return out

    def _norm(self, inputs) -> float:
        sq = sum(float((wide(t) ** 2).sum()) for i in inputs for t in i.values())
        return math.sqrt(sq)

    def expected(self, case, world, inputs):
        norm = self._norm(inputs)
        coef = min(1.0, float(case.params["max_norm"]) / (norm + CLIP_EPS))
        return [{**{k: narrow(wide(t) * coef, case.dtype) for k, t in i.items()},
                 "norm": torch.tensor(norm, dtype=torch.float64)} for i in inputs]

    def verify(self, case, world, inputs, outputs, tol):
        from .compare import compare_tensor, first_mismatch

        for r in range(world):
            c = outputs[r].get("calls")
            if c is None or c.numel() != 3:
                return {"case": case.name, "rank": r, "output": "calls", "reason": "missing",
                        "detail": f"rank {r} reported no all_reduce statistics"}
            if int(c[0]) != 1:
                return {"case": case.name, "rank": r, "output": "all_reduce", "reason": "semantics",
                        "expected": "exactly 1 all_reduce call", "got": f"{int(c[0])} calls",
                        "detail": f"rank {r} called all_reduce {int(c[0])} times; the norm needs exactly one call"}
            for name, t in inputs[r].items():
                got = outputs[r].get(name)
                if isinstance(got, torch.Tensor) and got.dtype != t.dtype:
                    return {"case": case.name, "rank": r, "output": name, "reason": "dtype", "expected": str(t.dtype),
                            "got": str(got.dtype), "detail": "each clipped shard must keep its gradient's dtype"}
        expected = self.expected(case, world, inputs)
        norm_tol = tol if case.dtype == "float64" else NORM_TOL
        for r in range(world):
            got = outputs[r].get("norm")
            m = compare_tensor(expected[r]["norm"], got, norm_tol)
            if m:
                m.update(case=case.name, rank=r, output="norm")
                if m.get("reason") == "shape":
                    m["detail"] = "total_norm must be a 0-dimensional tensor"
                return m
        return first_mismatch(case, [{k: v for k, v in e.items() if k != "norm"} for e in expected], outputs, tol)

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is one rank's gradient shards, 8 tensors."""
        from ..cards import CaseSpec

        n = max(16, size_bytes // _elem(perf.dtype))
        params = {"max_norm": 1.0, **perf.params, "bench": True}
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[n, 0], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        g = generator(0)
        shapes = self._shapes(case, 0, world, g) if case.params.get("bench") else []
        if not shapes:
            return int(case.shape[0]) * int(case.shape[1]) * _elem(case.dtype)
        return sum(math.prod(s) for s in shapes) * _elem(case.dtype)
