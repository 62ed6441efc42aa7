"""Golden semantics of two kernel-level fusions of tensor-parallel inference (issue #23, second wave): cuda_fusion2.

- `matmul_allreduce_decode`: the decode-time row-parallel linear layer. Rank r holds x_r [M, K] (its K columns of
  the activations, M = 1 .. 64 tokens) and w_r [N, K] (its K columns of the weight, stored as torch.nn.Linear
  stores a weight: out_features x in_features); every rank returns y = sum_r x_r @ w_r^T [M, N], and the same bits
  on every rank (a tensor-parallel group must agree on its activations). The metric is latency; the size is one
  rank's weight shard in bytes (the bytes the call must stream from memory).
- `vocab_embedding_allreduce`: Megatron's vocabulary-parallel embedding with its all-reduce. Rank r holds rows
  bounds[r] .. bounds[r+1] - 1 of the table E [V, d] (the split of fusion_vocab's `_vocab_bounds`: even, ragged or
  with an empty shard); every rank holds the same token ids [T] (int64 in [0, V), or -1 for padding) and returns
  out [T, d], out[i] = E[ids[i]] (zeros for -1), bit for bit: the sum over ranks of each rank's masked lookup.

The ids of a case are public (drawn from a shared seed of the case, the same on every rank and in every call);
the table rows and the activations and weights are private to the rank that holds them and fresh in every call.
"""

from __future__ import annotations

import functools

import torch

from . import register
from .base import GoldenOp, expect_tensor, generator, int_param, num_param, rand, to_dtype, wide
from .compare import first_mismatch
from .fusion_patterns import _elem, _known_params, _shared_seed
from .fusion_vocab import _check_bounds_params, _vocab_bounds
from .moe import _cuda_only

# ---- matmul + all-reduce at decode time ------------------------------------------------------------------------
#: the dtypes the prompt promises (tensor-core inputs)
DECODE_DTYPES = ("bfloat16", "float16")
#: limits the prompt states: tokens, inner dimension per rank, output features
MAX_M, MAX_K, MAX_N = 64, 1 << 16, 1 << 14


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a 16-bit float tensor (NaNs and signed zeros compare by their bits)."""
    return t.contiguous().view(torch.int16)


@register
class MatmulAllReduceDecode(GoldenOp):
    """`matmul_allreduce(x, w) -> y` (cuda): a row-parallel linear layer at decode time, fused with its all-reduce.

    case.shape = [M, K, N], params.k = K (cb_args.params[0]). Rank r holds x_r [M, K] and w_r [N, K]; every rank
    returns y = sum_r x_r @ w_r^T, [M, N], in the inputs' dtype, and all ranks return the same bits. Inputs are
    N(0, 1) (times params.x_scale for x, default 1). Size: one rank's weight shard, N * K elements; flops
    2 * M * K * N per rank.
    """

    name = "matmul_allreduce_decode"
    nccl_op = None  # the size is the weight shard each rank streams, not what the all-reduce moves
    functions = ("matmul_allreduce",)
    PARAMS = {"k", "x_scale"}

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)

    def validate_case(self, case):
        if case.dtype not in DECODE_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DECODE_DTYPES)} (tensor-core inputs), got {case.dtype}")
        if len(case.shape) != 3:
            raise ValueError(f"shape must be [M, K, N], got {case.shape}")
        m, k, n = (int(s) for s in case.shape)
        if not (1 <= m <= MAX_M and 1 <= k <= MAX_K and 1 <= n <= MAX_N):
            raise ValueError(f"shape [M, K, N] needs 1 <= M <= {MAX_M}, 1 <= K <= {MAX_K}, 1 <= N <= {MAX_N}, "
                             f"got {case.shape}")
        _known_params(case, self.PARAMS)
        if int_param(case, "k", low=1) != k:
            raise ValueError(f"params.k must equal shape[1] (the inner dimension), got k = {case.params['k']} for "
                             f"shape {case.shape}")
        num_param(case, "x_scale", 1.0, low=0)

    def make_inputs(self, case, rank, world, seed):
        m, k, n = (int(s) for s in case.shape)
        g = generator(seed)
        x = rand([m, k], case.dtype, g)
        scale = float(case.params.get("x_scale", 1.0))
        if scale != 1.0:
            x = (wide(x) * scale).to(to_dtype(case.dtype))
        return {"x": x, "w": rand([n, k], case.dtype, g)}

    def call(self, fns, inputs, case, rank, world):  # a python stand-in's convention (the judge uses cb_args)
        y = fns["matmul_allreduce"](inputs["x"], inputs["w"])
        return {"y": expect_tensor(y, "matmul_allreduce's return value")}

    def expected(self, case, world, inputs):
        total = sum(wide(i["x"]) @ wide(i["w"]).T for i in inputs)
        return [{"y": total.clone()} for _ in range(world)]

    def verify(self, case, world, inputs, outputs, tol):
        """Within tolerance of the float64 sum on every rank, and the same bits on every rank."""
        bad = first_mismatch(case, self.expected(case, world, inputs), outputs, tol)
        if bad is not None:
            return bad
        ref = _bits(outputs[0]["y"]).reshape(-1)
        for r in range(1, world):
            y = outputs[r]["y"]
            diff = (_bits(y).reshape(-1) != ref).nonzero()
            if diff.numel():
                i = int(diff[0])
                shape = tuple(y.shape)
                index = [int(v) for v in torch.unravel_index(torch.tensor(i), shape)]
                return {"case": case.name, "rank": r, "output": "y", "reason": "semantics", "index": index,
                        "expected": repr(float(outputs[0]["y"].reshape(-1)[i])), "got": repr(float(y.reshape(-1)[i])),
                        "wrong_count": int(diff.numel()), "total_count": int(ref.numel()),
                        "detail": f"rank {r}'s y differs from rank 0's in {int(diff.numel())} element(s): every rank "
                                  f"must return the same bits (both are within tolerance of the exact sum)"}
        return None

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is one rank's weight shard, N * K elements; M and N come from perf params (m, n)."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        m, n = int(params.pop("m", 16)), int(params.pop("n", 8192))
        k = max(1, min(MAX_K, size_bytes // (n * _elem(perf.dtype))))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[m, k, n], dtype=perf.dtype,
                        params={**params, "k": k})

    def metric_bytes(self, case, world):
        _, k, n = (int(s) for s in case.shape)
        return n * k * _elem(case.dtype)

    def flops(self, case, world):
        m, k, n = (int(s) for s in case.shape)
        return 2.0 * m * k * n


# ---- vocabulary-parallel embedding + all-reduce -----------------------------------------------------------------
EMBED_DTYPES = ("float32", "float16", "bfloat16")


@register
class VocabEmbeddingAllReduce(GoldenOp):
    """`vocab_embedding(table_shard, ids, vocab_bounds) -> out` (cuda): a vocabulary-parallel embedding lookup
    whose masked partial lookups are summed over the ranks.

    case.shape = [T, V, d]. Rank r holds table_shard = rows bounds[r] .. bounds[r+1] - 1 of E [V, d] (private,
    N(0, 1), fresh every call; `_vocab_bounds`: params shard_seed / empty_shard) and the public ids [T] (int64,
    the same on every rank and call) and vocab_bounds [world + 1] (int64). Every rank returns out [T, d],
    out[i] = E[ids[i]], zeros where ids[i] = -1; exact copies. Id params: ids_seed (default 0), zipf (popularity
    rank^-zipf over a shared permutation of the vocabulary: hot, repeated ids; default 0, uniform), only_shard
    (every id lies in shard only_shard % world, unless that shard is empty), pad (the share of -1 ids, default 0).
    Size: one rank's output, T * d elements.
    """

    name = "vocab_embedding_allreduce"
    nccl_op = None  # the metric bytes are the output rows every rank returns
    functions = ("vocab_embedding",)
    PARAMS = {"shard_seed", "empty_shard", "ids_seed", "zipf", "only_shard", "pad", "vocab", "dim"}

    def validate_card(self, card):
        _cuda_only(self, card)
        super().validate_card(card)
        for dt in {c.dtype for c in card.cases} | {card.performance.dtype}:
            tol = card.tolerance_for(dt)
            if tol.rtol != 0 or tol.atol != 0:
                raise ValueError(f"field 'tolerance.{dt}': rows are copied exactly; set rtol = 0 and atol = 0")

    def validate_case(self, case):
        if len(case.shape) != 3 or any(int(s) < 1 for s in case.shape):
            raise ValueError(f"shape must be [tokens, vocab, dim] with all >= 1, got {case.shape}")
        if case.dtype not in EMBED_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(EMBED_DTYPES)}, got {case.dtype}")
        _known_params(case, self.PARAMS)
        _check_bounds_params(case)
        int_param(case, "ids_seed", 0)
        num_param(case, "zipf", 0.0, low=0)
        int_param(case, "only_shard", low=0, optional=True)
        num_param(case, "pad", 0.0, 0.0, 1.0)
        for key, i in (("vocab", 1), ("dim", 2)):  # the benchmark's case carries them (size_case): they must agree
            if key in case.params and int_param(case, key, low=1) != int(case.shape[i]):
                raise ValueError(f"params.{key}, where given, must equal shape[{i}]")

    def bounds(self, case, world: int) -> list[int]:
        return _vocab_bounds(case, world, int(case.shape[1]))

    @staticmethod
    @functools.lru_cache(maxsize=16)
    def _ids(t: int, vocab: int, world: int, lo: int, hi: int, zipf: float, pad: float, seed: int) -> torch.Tensor:
        g = generator(seed)
        if zipf > 0:
            perm = torch.randperm(hi - lo, generator=g)
            weights = torch.empty(hi - lo, dtype=torch.float64)
            weights[perm] = torch.arange(1, hi - lo + 1, dtype=torch.float64) ** -zipf
            ids = torch.multinomial(weights, t, replacement=True, generator=g) + lo
        else:
            ids = torch.randint(lo, hi, (t,), generator=g, dtype=torch.int64)
        if pad > 0:
            ids[torch.rand(t, generator=g, dtype=torch.float64) < pad] = -1
        return ids.to(torch.int64)

    def ids(self, case, world: int) -> torch.Tensor:
        """The case's token ids: public, the same on every rank and in every call."""
        t, vocab, _ = (int(s) for s in case.shape)
        lo, hi = 0, vocab
        only = case.params.get("only_shard")
        if only is not None:
            b = self.bounds(case, world)
            s = int(only) % world
            if b[s + 1] > b[s]:
                lo, hi = b[s], b[s + 1]
        seed = _shared_seed(int(case.params.get("ids_seed", 0)), world, t, vocab, 41)
        return self._ids(t, vocab, world, lo, hi, float(case.params.get("zipf", 0.0)),
                         float(case.params.get("pad", 0.0)), seed).clone()

    def make_inputs(self, case, rank, world, seed):
        d = int(case.shape[2])
        b = self.bounds(case, world)
        table = rand([b[rank + 1] - b[rank], d], case.dtype, generator(seed))
        return {"table_shard": table, "ids": self.ids(case, world),
                "vocab_bounds": torch.tensor(b, dtype=torch.int64)}

    def call(self, fns, inputs, case, rank, world):  # a python stand-in's convention (the judge uses cb_args)
        out = fns["vocab_embedding"](inputs["table_shard"], inputs["ids"], inputs["vocab_bounds"])
        return {"out": expect_tensor(out, "vocab_embedding's return value")}

    @staticmethod
    def _lookup(inputs, ids: torch.Tensor, cols: torch.Tensor | None, d: int) -> torch.Tensor:
        """E[ids] (zeros for -1): whole rows when cols is None, else the element cols[j] of row ids[j]."""
        table = torch.cat([i["table_shard"] for i in inputs])
        safe = ids.clamp_min(0)
        if cols is None:
            out = table[safe].clone()
            out[ids < 0] = 0
        else:
            out = table.reshape(-1)[safe * d + cols].clone()
            out[ids < 0] = 0
        return out

    def expected(self, case, world, inputs):
        d = int(case.shape[2])
        out = self._lookup(inputs, inputs[0]["ids"], None, d)
        return [{"out": out.clone()} for _ in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        t, _, d = (int(s) for s in case.shape)
        ids = inputs[0]["ids"]
        res = []
        for r in range(world):
            flat = pick(r, "out", t * d).to(torch.int64)
            res.append({"out": self._lookup(inputs, ids[flat // d], flat % d, d)})
        return res

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is one rank's output, T * d elements; V and d come from perf params (vocab, dim)."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        vocab, dim = int(params.get("vocab", 16384)), int(params.get("dim", 4096))
        t = max(1, size_bytes // (dim * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t, vocab, dim], dtype=perf.dtype,
                        params=params)

    def metric_bytes(self, case, world):
        t, _, d = (int(s) for s in case.shape)
        return t * d * _elem(case.dtype)


__all__ = ["MatmulAllReduceDecode", "VocabEmbeddingAllReduce"]
