"""Golden semantics of fusion_vocab tasks (issue #22, second part).

Vocabulary-parallel building blocks of Megatron-style tensor parallelism beyond the cross-entropy: an embedding
lookup whose table is sharded by vocabulary rows while the tokens are sharded by sequence, and next-token sampling
(top-k, temperature, inverse CDF) over logits sharded by vocabulary. The vocabulary's split over ranks (uneven,
possibly with empty shards) and the sequence's split are public case data that every rank is handed; the table
rows, the token ids and the logits are private to the rank that holds them.
"""

from __future__ import annotations

import functools

import torch

from . import register
from .base import CandidateError, GoldenOp, expect_tensor, generator, int_param, narrow, num_param, rand, to_dtype, wide
from .compare import compare_tensor
from .fusion_patterns import _elem, _float_dtype, _known_params, _shared_seed

_int_param = functools.partial(int_param, optional=True)


def _vocab_bounds(case, world: int, vocab: int) -> list[int]:
    """The vocabulary's split: rank r owns ids bounds[r] .. bounds[r+1] - 1 (world + 1 ints, 0 first, vocab last).

    Default: floor(r * vocab / world) (shards differ by at most one id; some are empty when vocab < world).
    params.shard_seed: world - 1 cut points drawn in [0, vocab] from that shared seed instead (ragged shards, some
    possibly empty). params.empty_shard: rank (empty_shard % world) owns nothing, the others split evenly."""
    seed = case.params.get("shard_seed")
    if seed is not None:
        g = generator(_shared_seed(int(seed), world, vocab, 17))
        cuts = sorted(int(c) for c in torch.randint(0, vocab + 1, (world - 1,), generator=g))
        return [0] + cuts + [vocab]
    empty = case.params.get("empty_shard")
    if empty is not None and world > 1:
        e = int(empty) % world
        inner = [(i * vocab) // (world - 1) for i in range(world)]
        return inner[:e + 1] + inner[e:]
    return [(r * vocab) // world for r in range(world + 1)]


def _check_bounds_params(case) -> None:
    _int_param(case, "shard_seed")
    _int_param(case, "empty_shard", low=0)
    if case.params.get("shard_seed") is not None and case.params.get("empty_shard") is not None:
        raise ValueError("params.shard_seed and params.empty_shard exclude each other")


def _what(res) -> str:
    return type(res).__name__ + (f" of {len(res)}" if isinstance(res, (tuple, list)) else "")


# ---- embedding lookup: table sharded by vocabulary, tokens by sequence ----------------------------------------------
@register
class VocabParallelEmbedding(GoldenOp):
    """`vocab_parallel_embedding(ids, table_shard, vocab_bounds, seq_lens) -> out`: a vocabulary-parallel
    embedding lookup with sequence-parallel tokens and output.

    case.shape = [n, V, d]: n tokens per rank (unless ragged_seed / empty_rank say otherwise), a table E [V, d].
    Rank r holds rows vocab_bounds[r] .. vocab_bounds[r+1] - 1 of E (table_shard, [V_r, d]; `_vocab_bounds`) and
    its own seq_lens[r] token ids (ids, int64 in [0, V)); it returns out [seq_lens[r], d] with out[i] = E[ids[i]],
    exact copies. params: shard_seed / empty_shard (the vocabulary's split), ragged_seed (every rank's length drawn
    in [0, n] from that shared seed), empty_rank (rank empty_rank % world has no tokens), zipf (ids drawn with
    popularity rank^-zipf over a shared permutation of the vocabulary: repeated ids; default 0, uniform),
    only_shard (every id lies in shard only_shard % world, unless that shard is empty).
    """

    name = "vocab_parallel_embedding"
    nccl_op = None  # the metric bytes are a rank's output rows
    functions = ("vocab_parallel_embedding",)
    PARAMS = {"shard_seed", "empty_shard", "ragged_seed", "empty_rank", "zipf", "only_shard"}

    def validate_case(self, case):
        if len(case.shape) != 3 or case.shape[0] < 0 or case.shape[1] < 1 or case.shape[2] < 1:
            raise ValueError(f"shape must be [tokens_per_rank, vocab, dim] with vocab, dim >= 1, got {case.shape}")
        _float_dtype(case)
        _known_params(case, self.PARAMS)
        _check_bounds_params(case)
        _int_param(case, "ragged_seed")
        _int_param(case, "empty_rank", low=0)
        num_param(case, "zipf", default=0.0, low=0)
        _int_param(case, "only_shard", low=0)

    def bounds(self, case, world: int) -> list[int]:
        return _vocab_bounds(case, world, int(case.shape[1]))

    def seq_lens(self, case, world: int) -> list[int]:
        n = int(case.shape[0])
        ragged = case.params.get("ragged_seed")
        if ragged is not None:
            g = generator(_shared_seed(int(ragged), world, n, 23))
            lens = [int(x) for x in torch.randint(0, n + 1, (world,), generator=g)]
        else:
            lens = [n] * world
        if case.params.get("empty_rank") is not None:
            lens[int(case.params["empty_rank"]) % world] = 0
        return lens

    @staticmethod
    @functools.lru_cache(maxsize=8)
    def _popularity(vocab: int, zipf: float, seed: int) -> torch.Tensor:
        """Sampling weights of the ids: rank^-zipf, the ranks a shared permutation of the vocabulary."""
        perm = torch.randperm(vocab, generator=generator(seed))
        weights = torch.empty(vocab, dtype=torch.float64)
        weights[perm] = torch.arange(1, vocab + 1, dtype=torch.float64) ** -zipf
        return weights

    def make_inputs(self, case, rank, world, seed):
        _, vocab, dim = (int(s) for s in case.shape)
        bounds, n = self.bounds(case, world), self.seq_lens(case, world)[rank]
        g = generator(seed)
        table = rand([bounds[rank + 1] - bounds[rank], dim], case.dtype, g)
        lo, hi = 0, vocab
        if case.params.get("only_shard") is not None:
            s = int(case.params["only_shard"]) % world
            if bounds[s + 1] > bounds[s]:
                lo, hi = bounds[s], bounds[s + 1]
        zipf = float(case.params.get("zipf", 0.0))
        if n == 0:
            ids = torch.zeros(0, dtype=torch.int64)
        elif zipf > 0:
            w = self._popularity(vocab, zipf, _shared_seed(vocab, 29))[lo:hi]
            ids = torch.multinomial(w, n, replacement=True, generator=g) + lo
        else:
            ids = torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64)
        return {"ids": ids, "table_shard": table}

    def call(self, fns, inputs, case, rank, world):
        out = fns["vocab_parallel_embedding"](inputs["ids"], inputs["table_shard"], self.bounds(case, world),
                                              self.seq_lens(case, world))
        return {"out": expect_tensor(out, "vocab_parallel_embedding's return value")}

    def expected(self, case, world, inputs):
        table = torch.cat([wide(i["table_shard"]) for i in inputs])
        return [{"out": narrow(table[i["ids"]], case.dtype)} for i in inputs]

    def expected_samples(self, case, world, inputs, pick):
        dim = int(case.shape[2])
        table = torch.cat([i["table_shard"] for i in inputs])
        out = []
        for r, i in enumerate(inputs):
            idx = pick(r, "out", int(i["ids"].numel()) * dim)
            out.append({"out": narrow(wide(table[i["ids"][idx // dim], idx % dim]), case.dtype)})
        return out

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is one rank's output, n * dim elements."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        vocab, dim = int(params.pop("vocab", 16384)), int(params.pop("dim", 256))
        n = max(1, size_bytes // (dim * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[n, vocab, dim], dtype=perf.dtype,
                        params=params)

    def metric_bytes(self, case, world):
        n, _, dim = (int(s) for s in case.shape)
        return n * dim * _elem(case.dtype)


# ---- sampling: top-k, temperature, inverse CDF over vocabulary-parallel logits --------------------------------------
@register
class VocabParallelSampling(GoldenOp):
    """`vocab_parallel_sample(logits_shard, vocab_bounds, k, temperature, u) -> (token, logprob)`: next-token
    sampling from logits sharded by vocabulary.

    case.shape = [B, V]. Rank r holds columns vocab_bounds[r] .. vocab_bounds[r+1] - 1 of the logits L [B, V]
    (`_vocab_bounds`); every rank gets the same u [B] (float64 in [0, 1)). Per row b: the k candidates are the
    first k ids in the order (L[b, id] descending, id ascending); with z_j = L[b, c_j] / temperature over them,
    p_j = softmax(z)_j and C_j = p_0 + ... + p_j, the token is c_i for i = min(k - 1, #{j : C_j <= u[b]}), and
    logprob = log p_i. Every rank returns the same token [B] (int64) and logprob [B]. A token whose CDF interval
    [C_{j-1}, C_j) lies within EPS of u[b] is accepted too (float rounding at an interval's edge), the logprob then
    checked against it. params: k (1 <= k <= V), temperature (> 0, default 1), shard_seed / empty_shard (the
    vocabulary's split), scale (logits N(0, 1) * scale, default 1), rank_shift (rank r's logits + rank_shift * r),
    quantum (logits rounded to multiples of it: ties within and across shards), u_seed (the uniforms' seed).
    """

    name = "vocab_parallel_sampling"
    nccl_op = None
    functions = ("vocab_parallel_sample",)
    PARAMS = {"k", "temperature", "shard_seed", "empty_shard", "scale", "rank_shift", "quantum", "u_seed"}
    EPS = 1e-5

    def validate_case(self, case):
        if len(case.shape) != 2 or any(int(s) < 1 for s in case.shape):
            raise ValueError(f"shape must be [batch, vocab] with both >= 1, got {case.shape}")
        _float_dtype(case)
        _known_params(case, self.PARAMS)
        if "k" not in case.params:
            raise ValueError("params.k is required")
        _int_param(case, "k", low=1, high=int(case.shape[1]))
        num_param(case, "temperature", default=1.0, low=1e-3)
        _check_bounds_params(case)
        num_param(case, "scale", default=1.0, low=0)
        num_param(case, "rank_shift", default=0.0)
        num_param(case, "quantum", default=0.0, low=0)
        _int_param(case, "u_seed")

    def bounds(self, case, world: int) -> list[int]:
        return _vocab_bounds(case, world, int(case.shape[1]))

    @staticmethod
    def k(case) -> int:
        return int(case.params["k"])

    @staticmethod
    def temperature(case) -> float:
        return float(case.params.get("temperature", 1.0))

    def uniforms(self, case, world: int) -> torch.Tensor:
        b, vocab = (int(s) for s in case.shape)
        g = generator(_shared_seed(int(case.params.get("u_seed", 0)), world, b, vocab, 31))
        return torch.rand(b, generator=g, dtype=torch.float64)

    def make_inputs(self, case, rank, world, seed):
        b = int(case.shape[0])
        bounds = self.bounds(case, world)
        x = rand([b, bounds[rank + 1] - bounds[rank]], torch.float64, generator(seed))
        x = x * float(case.params.get("scale", 1.0)) + float(case.params.get("rank_shift", 0.0)) * rank
        q = float(case.params.get("quantum", 0.0))
        if q > 0:
            x = torch.round(x / q) * q
        return {"logits_shard": x.to(to_dtype(case.dtype)), "u": self.uniforms(case, world)}

    def call(self, fns, inputs, case, rank, world):
        res = fns["vocab_parallel_sample"](inputs["logits_shard"], self.bounds(case, world), self.k(case),
                                           self.temperature(case), inputs["u"])
        if not isinstance(res, (tuple, list)) or len(res) != 2:
            raise CandidateError("vocab_parallel_sample must return a tuple (token, logprob) of two tensors, got "
                                 + _what(res))
        return {"token": expect_tensor(res[0], "vocab_parallel_sample(...)[0] (token)"),
                "logprob": expect_tensor(res[1], "vocab_parallel_sample(...)[1] (logprob)")}

    def _rows(self, case, inputs):
        """Per row, in float64: the candidates' ids [B, k] in order, their log-probabilities and CDF [B, k], and the
        position [B] of the token the rule picks."""
        full = torch.cat([wide(i["logits_shard"]) for i in inputs], dim=1)
        vals, ids = torch.sort(full, dim=1, descending=True, stable=True)  # stable: ties keep id order
        k = self.k(case)
        z = vals[:, :k] / self.temperature(case)
        logp = z - torch.logsumexp(z, dim=1, keepdim=True)
        cdf = torch.cumsum(torch.exp(logp), dim=1)
        u = inputs[0]["u"].to(torch.float64)
        pos = (cdf <= u[:, None]).sum(dim=1).clamp(max=k - 1)
        return ids[:, :k], logp, cdf, pos

    def expected(self, case, world, inputs):
        ids, logp, _, pos = self._rows(case, inputs)
        rows = torch.arange(ids.shape[0])
        return [{"logprob": narrow(logp[rows, pos], case.dtype), "token": ids[rows, pos].clone()}
                for _ in range(world)]

    def verify(self, case, world, inputs, outputs, tol):
        ids, logp, cdf, pos = self._rows(case, inputs)
        b, k = ids.shape
        rows = torch.arange(b)
        u = inputs[0]["u"].to(torch.float64)
        # the tokens a u within EPS of an interval's edge may pick: [C_{j-1} - EPS, C_j + EPS), open at both ends
        lo = torch.cat([torch.full((b, 1), float("-inf"), dtype=torch.float64), cdf[:, :-1] - self.EPS], dim=1)
        hi = torch.cat([cdf[:, :-1] + self.EPS, torch.full((b, 1), float("inf"), dtype=torch.float64)], dim=1)
        ok = (lo <= u[:, None]) & (u[:, None] < hi)
        ok[rows, pos] = True
        first = None
        for r, out in enumerate(outputs):
            def bad(name: str, **kw) -> dict:
                return {"case": case.name, "rank": r, "output": name, **kw}

            for name in ("token", "logprob"):
                g = out.get(name)
                if g is None:
                    return bad(name, reason="missing", detail=f"rank {r} returned no {name}")
                if tuple(g.shape) != (b,):
                    return bad(name, reason="shape", expected=str([b]), got=str(list(g.shape)),
                               detail=f"{name} must be a 1-D tensor of the {b} rows")
            tok = out["token"].detach().cpu()
            if tok.dtype != torch.int64:
                return bad("token", reason="dtype", expected="torch.int64", got=str(tok.dtype))
            if not out["logprob"].is_floating_point():
                return bad("logprob", reason="dtype", expected="a floating dtype", got=str(out["logprob"].dtype))
            match = ids == tok[:, None]
            accepted = (match & ok).any(dim=1)
            at = torch.where(accepted, match.to(torch.int64).argmax(dim=1), pos)
            mm = compare_tensor(ids[rows, at], tok, tol)
            if mm:
                row = mm["index"][0]
                j = int(pos[row])
                low = float(cdf[row, j - 1]) if j else 0.0
                mm["detail"] = (f"row {row}: the token is candidate {j} of the top-{k} (CDF interval "
                                f"[{low!r}, {float(cdf[row, j])!r}) holds u = {float(u[row])!r})")
                return {**mm, **bad("token")}
            mm = compare_tensor(logp[rows, at], out["logprob"].detach().cpu(), tol)
            if mm:
                return {**mm, **bad("logprob")}
            if first is None:
                first = tok
            elif not torch.equal(tok, first):
                row = int((tok != first).nonzero()[0])
                return bad("token", reason="value", index=[row], expected=str(int(first[row])), got=str(int(tok[row])),
                           detail=f"row {row}: rank {r} returned token {int(tok[row])}, rank 0 token "
                                  f"{int(first[row])} (both at an interval's edge); every rank must return the "
                                  "same tokens")
        return None

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is one rank's logit shard, B * vocab_per_rank elements (the vocabulary split evenly)."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        vpr = int(params.pop("vocab_per_rank", 16384))
        b = max(1, size_bytes // (vpr * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[b, world * vpr], dtype=perf.dtype,
                        params=params)

    def metric_bytes(self, case, world):
        b, vocab = (int(s) for s in case.shape)
        return b * -(-vocab // world) * _elem(case.dtype)
