"""Golden semantics of fusion_attention tasks (issue #22, second part).

Two layouts of causal self-attention over ranks that the ring and Ulysses ops (fusion_patterns) do not cover: a
tensor-parallel attention block with grouped-query attention under sequence parallelism (the projections' weights
sharded by heads, key/value heads possibly fewer than the ranks), and context-parallel attention over the
load-balanced zigzag sharding of the sequence (each rank an early and a late chunk). The attention itself is
fusion_patterns' float64 `_attend`, one (query row, head) pair at a time.
"""

from __future__ import annotations

import functools
import math

import torch

from . import register
from .base import GoldenOp, expect_tensor, generator, int_param, narrow, num_param, rand, wide
from .fusion_patterns import (_AttentionOp, _attend, _attention_flops, _cast, _elem, _float_dtype, _known_params,
                              _shared_rand, _shared_seed)

_int_param = functools.partial(int_param, optional=True)


# ---- tensor-parallel attention block with GQA, under sequence parallelism --------------------------------------------
def kv_heads_of(world: int, q_per_rank: int, case) -> int:
    """The number of key/value heads at this world size: params.kv_heads, or H / params.group."""
    if case.params.get("kv_heads") is not None:
        return int(case.params["kv_heads"])
    return world * q_per_rank // int(case.params["group"])


def kv_span(rank: int, world: int, q_per_rank: int, kv_heads: int) -> tuple[int, int]:
    """The key/value heads [first, last] rank `rank` holds: exactly those its query heads read (query head h reads
    kv head h // (H / Hkv)). With Hkv a multiple of the world that is Hkv / world heads per rank; with fewer kv heads
    than ranks one head each, the same on world / Hkv neighbouring ranks; otherwise neighbours may share a head."""
    group = world * q_per_rank // kv_heads
    return rank * q_per_rank // group, ((rank + 1) * q_per_rank - 1) // group


@register
class TpAttentionGqa(GoldenOp):
    """`tp_attention(x, wq, wk, wv, wo, num_heads, num_kv_heads) -> y`: a TP + SP causal self-attention block.

    case.shape = [n, d, q, D]: every rank holds n tokens (rank r: rows r*n .. r*n + n - 1 of X [S = W*n, d]), the
    block has H = W * q query heads of dimension D and Hkv key/value heads (params.kv_heads, the same at every world
    size, or H / params.group; Hkv divides H). Rank r holds wq [d, q*D] (columns r*q*D .. of Wq [d, H*D], query heads
    r*q .. r*q + q - 1), wo [q*D, d] (the same heads' rows of Wo [H*D, d]) and wk, wv [d, m*D]: the kv heads
    `kv_span` names (columns j0*D .. of Wk, Wv [d, Hkv*D]). Wq and Wo are private to each rank; Wk and Wv are
    replicated where ranks share a head, so they come from a seed derived from public case data. It returns its rows
    of Y = concat_h(softmax(Q_h K_{h//g}^T / sqrt(D), causal) V_{h//g}) Wo, Q = X Wq, K = X Wk, V = X Wv, g = H/Hkv.
    params: kv_heads or group (exactly one), q_scale (Wq * q_scale: large logits), x_scale, shared_seed (Wk, Wv).
    """

    name = "tp_attention_gqa"
    nccl_op = None
    functions = ("tp_attention",)
    PARAMS = {"kv_heads", "group", "q_scale", "x_scale", "shared_seed"}

    def validate_case(self, case):
        if len(case.shape) != 4 or any(int(s) < 1 for s in case.shape):
            raise ValueError(f"shape must be [tokens_per_rank, d_model, q_heads_per_rank, head_dim], all >= 1, got "
                             f"{case.shape}")
        _float_dtype(case)
        _known_params(case, self.PARAMS)
        kvh, grp = _int_param(case, "kv_heads", low=1), _int_param(case, "group", low=1)
        if (kvh is None) == (grp is None):
            raise ValueError("give exactly one of params.kv_heads (Hkv at every world size) and params.group (Hkv = "
                             "H / group)")
        num_param(case, "q_scale", default=1.0, low=0)
        num_param(case, "x_scale", default=1.0, low=0)
        _int_param(case, "shared_seed")

    def validate_card(self, card):
        super().validate_card(card)
        for i, case in enumerate(card.cases):
            bad = [w for w in card.world.sizes if not self.supports_world(w, case)]
            if bad:
                raise ValueError(f"field 'cases.{i}' ({case.name}): the kv heads must divide H = world * "
                                 f"{case.shape[2]} query heads at every world size; they do not at {bad}")

    def supports_world(self, world, case):
        h = world * int(case.shape[2])
        if case.params.get("kv_heads") is not None:
            return h % int(case.params["kv_heads"]) == 0
        return h % int(case.params["group"]) == 0

    def dims(self, case, world: int) -> tuple[int, int, int, int, int, int]:
        """(n, d, q heads per rank, D, H, Hkv)."""
        n, d, q, hd = (int(s) for s in case.shape)
        return n, d, q, hd, world * q, kv_heads_of(world, q, case)

    def kv_weights(self, case, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The replicated Wk, Wv [d, Hkv*D] in the case dtype."""
        _, d, _, hd, _, kvh = self.dims(case, world)
        seed = _shared_seed(int(case.params.get("shared_seed", 0)), world, d, hd, kvh, 43)
        w = _shared_rand(seed, (2, d, kvh * hd), "float64") / math.sqrt(d)
        return _cast(w[0], case.dtype), _cast(w[1], case.dtype)

    def make_inputs(self, case, rank, world, seed):
        n, d, q, hd, heads, kvh = self.dims(case, world)
        g = generator(seed)
        x = rand([n, d], torch.float64, g) * float(case.params.get("x_scale", 1.0))
        wq = rand([d, q * hd], torch.float64, g) * (float(case.params.get("q_scale", 1.0)) / math.sqrt(d))
        wo = rand([q * hd, d], torch.float64, g) / math.sqrt(heads * hd)
        j0, j1 = kv_span(rank, world, q, kvh)
        wk, wv = self.kv_weights(case, world)
        return {"x": _cast(x, case.dtype), "wq": _cast(wq, case.dtype), "wo": _cast(wo, case.dtype),
                "wk": wk[:, j0 * hd:(j1 + 1) * hd].clone(), "wv": wv[:, j0 * hd:(j1 + 1) * hd].clone()}

    def call(self, fns, inputs, case, rank, world):
        _, _, _, _, heads, kvh = self.dims(case, world)
        y = fns["tp_attention"](inputs["x"], inputs["wq"], inputs["wk"], inputs["wv"], inputs["wo"], heads, kvh)
        return {"y": expect_tensor(y, "tp_attention's return value")}

    def _rows(self, case, world, inputs, rows: torch.Tensor) -> torch.Tensor:
        """Rows `rows` (global indices, sorted, unique) of Y, in float64."""
        n, d, q, hd, heads, kvh = self.dims(case, world)
        group = heads // kvh
        x = torch.cat([wide(i["x"]) for i in inputs])  # [S, d]
        wq = torch.cat([wide(i["wq"]) for i in inputs], dim=1)
        wo = torch.cat([wide(i["wo"]) for i in inputs], dim=0)
        wk, wv = (wide(w) for w in self.kv_weights(case, world))
        k = (x @ wk).view(-1, kvh, hd)
        v = (x @ wv).view(-1, kvh, hd)
        qq = (x[rows] @ wq).view(-1, heads, hd)  # only the rows asked for
        u = rows.numel()
        prow = torch.arange(u).repeat_interleave(heads)
        phead = torch.arange(heads).repeat(u)
        o, _ = _attend(qq[prow, phead], rows[prow], phead // group, [k], [v], True)
        return o.view(u, heads * hd) @ wo

    def expected(self, case, world, inputs):
        n = int(case.shape[0])
        y = self._rows(case, world, inputs, torch.arange(world * n))
        return [{"y": narrow(y[r * n:(r + 1) * n].clone(), case.dtype)} for r in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        n, d = int(case.shape[0]), int(case.shape[1])
        out = []
        for r in range(world):
            idx = pick(r, "y", n * d)
            rows, where = torch.unique(idx // d, return_inverse=True)
            out.append({"y": narrow(self._rows(case, world, inputs, r * n + rows)[where, idx % d], case.dtype)})
        return out

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is one rank's activation shard x, n * d elements."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        d, q, hd = int(params.pop("d", 1024)), int(params.pop("q_heads_per_rank", 2)), int(params.pop("head_dim", 128))
        n = max(1, size_bytes // (d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[n, d, q, hd], dtype=perf.dtype,
                        params=params)

    def metric_bytes(self, case, world):
        n, d = int(case.shape[0]), int(case.shape[1])
        return n * d * _elem(case.dtype)

    def flops(self, case, world):
        """The whole block's FLOPs over the world size: four projections and the causal attention."""
        n, d, _, hd, heads, kvh = self.dims(case, world)
        s = world * n
        return (2.0 * s * d * hd * (2 * heads + 2 * kvh) + 2.0 * s * (s + 1) * heads * hd) / world


# ---- context parallelism over the zigzag sharding ----------------------------------------------------------------
def zigzag_chunks(rank: int, world: int) -> tuple[int, int]:
    """The two chunks (of 2 * world) that rank `rank` holds: an early one and its mirror image from the end."""
    return rank, 2 * world - 1 - rank


@register
class ContextParallelZigzag(_AttentionOp):
    """`zigzag_attention(q, k, v) -> out`: causal attention over a sequence sharded in the zigzag layout.

    case.shape = [c, H, D]: the sequence of S = 2 * W * c positions is cut into 2W chunks of c; rank r holds
    chunks r and 2W - 1 - r: q, k, v [2c, H, D], rows 0 .. c-1 the positions r*c .. r*c + c - 1 and rows c .. 2c-1
    the positions (2W-1-r)*c .. (2W-1-r)*c + c - 1. It returns out [2c, H, D] = softmax(q k^T / sqrt(D), causal
    over global positions) v for its own rows. params: q_scale (queries N(0,1) * q_scale), key_drift (the keys of
    chunk j are shifted by key_drift * j: blocks whose scores differ by hundreds).
    """

    name = "context_parallel_zigzag"
    nccl_op = None
    functions = ("zigzag_attention",)
    PARAMS = {"q_scale", "key_drift"}

    def validate_case(self, case):
        if len(case.shape) != 3 or case.shape[0] < 0 or case.shape[1] < 1 or case.shape[2] < 1:
            raise ValueError(f"shape must be [chunk_len, heads, head_dim] with heads, head_dim >= 1, got {case.shape}")
        _float_dtype(case)
        _known_params(case, self.PARAMS)
        num_param(case, "q_scale", default=1.0, low=0)
        num_param(case, "key_drift", default=0.0)

    def make_inputs(self, case, rank, world, seed):
        c, heads, dim = (int(s) for s in case.shape)
        g = generator(seed)
        q = rand([2 * c, heads, dim], torch.float64, g) * float(case.params.get("q_scale", 1.0))
        k = rand([2 * c, heads, dim], torch.float64, g)
        v = rand([2 * c, heads, dim], torch.float64, g)
        early, late = zigzag_chunks(rank, world)
        drift = float(case.params.get("key_drift", 0.0))
        k[:c] += drift * early
        k[c:] += drift * late
        return {"q": _cast(q, case.dtype), "k": _cast(k, case.dtype), "v": _cast(v, case.dtype)}

    def call(self, fns, inputs, case, rank, world):
        out = fns["zigzag_attention"](inputs["q"], inputs["k"], inputs["v"])
        return {"out": expect_tensor(out, "zigzag_attention's return value")}

    @staticmethod
    def positions(c: int, rank: int, world: int) -> torch.Tensor:
        """The global positions of rank `rank`'s 2c rows."""
        early, late = zigzag_chunks(rank, world)
        return torch.cat([torch.arange(early * c, early * c + c), torch.arange(late * c, late * c + c)])

    def _rows(self, case, world, inputs, rank: int, idx: torch.Tensor) -> torch.Tensor:
        """The outputs of rank `rank` at flat positions idx of its [2c, H, D] out, in float64."""
        c, heads, dim = (int(s) for s in case.shape)
        owner = [0] * (2 * world)  # chunk j -> (rank, row offset) in sequence order
        for r in range(world):
            early, late = zigzag_chunks(r, world)
            owner[early], owner[late] = (r, 0), (r, c)
        k_parts = [inputs[r]["k"][o:o + c] for r, o in owner]
        v_parts = [inputs[r]["v"][o:o + c] for r, o in owner]
        row, head = idx // (heads * dim), (idx // dim) % heads
        pairs, where = torch.unique(row * heads + head, return_inverse=True)
        prow, phead = pairs // heads, pairs % heads
        pos = self.positions(c, rank, world)
        o, _ = _attend(inputs[rank]["q"][prow, phead], pos[prow], phead, k_parts, v_parts, True)
        return o[where, idx % dim]

    def expected(self, case, world, inputs):
        c, heads, dim = (int(s) for s in case.shape)
        numel = 2 * c * heads * dim
        return [{"out": narrow(self._rows(case, world, inputs, r, torch.arange(numel)).view(2 * c, heads, dim),
                               case.dtype)} for r in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        c, heads, dim = (int(s) for s in case.shape)
        return [{"out": narrow(self._rows(case, world, inputs, r, pick(r, "out", 2 * c * heads * dim)), case.dtype)}
                for r in range(world)]

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is one rank's q, 2c * heads * head_dim elements."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        heads = int(params.pop("heads", self.bench_heads))
        dim = int(params.pop("head_dim", self.bench_head_dim))
        c = max(1, size_bytes // (2 * heads * dim * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[c, heads, dim], dtype=perf.dtype,
                        params=params)

    def metric_bytes(self, case, world):
        c, heads, dim = (int(s) for s in case.shape)
        return 2 * c * heads * dim * _elem(case.dtype)

    def flops(self, case, world):
        c, heads, dim = (int(s) for s in case.shape)
        return _attention_flops([2 * c] * world, heads, dim, True, world)


__all__ = ["ContextParallelZigzag", "TpAttentionGqa", "kv_span", "zigzag_chunks"]
