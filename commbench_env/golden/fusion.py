"""Communication fused with compute: all-gather + matmul, matmul + reduce-scatter, vocab-parallel cross-entropy."""

from __future__ import annotations

import functools

import torch

from . import register
from .base import GoldenOp, elem_size as _elem, expect_tensor, generator, narrow, rand, to_dtype, wide


def _dots(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """rows[s] . cols[:, s] for every s, in float64: single entries of a product without the whole product."""
    return (wide(rows) * wide(cols).T).sum(dim=1)


def _check_mkn(case) -> None:
    if len(case.shape) != 3 or any(int(s) < 1 for s in case.shape):
        raise ValueError(f"shape must be [m, k, n] with every size >= 1, got {case.shape}")
    if not to_dtype(case.dtype).is_floating_point:
        raise ValueError(f"dtype must be a floating type, got {case.dtype}")


@register
class AllGatherMatmul(GoldenOp):
    """`allgather_matmul(x, w) -> y`: sequence-parallel input times a rank-local weight shard.

    case.shape = [m, k, n]. Rank r holds x_r [m, k] and w_r [k, n] and returns cat(x_0, ..., x_{world-1}) @ w_r,
    shape [world * m, n] (row block s of y is x_s @ w_r).
    """

    name = "allgather_matmul"
    nccl_op = "all_gather"
    functions = ("allgather_matmul",)

    def validate_case(self, case):
        _check_mkn(case)

    def make_inputs(self, case, rank, world, seed):
        m, k, n = (int(s) for s in case.shape)
        g = generator(seed)
        return {"x": rand([m, k], case.dtype, g), "w": rand([k, n], case.dtype, g)}

    def call(self, fns, inputs, case, rank, world):
        return {"y": expect_tensor(fns["allgather_matmul"](inputs["x"], inputs["w"]), "allgather_matmul's return value")}

    def expected(self, case, world, inputs):
        x = torch.cat([wide(i["x"]) for i in inputs])
        return [{"y": narrow(x @ wide(i["w"]), case.dtype)} for i in inputs]

    def expected_samples(self, case, world, inputs, pick):
        m, _, n = (int(s) for s in case.shape)
        x = torch.cat([i["x"] for i in inputs])
        out = []
        for r, i in enumerate(inputs):
            idx = pick(r, "y", world * m * n)
            out.append({"y": narrow(_dots(x[idx // n], i["w"][:, idx % n]), case.dtype)})
        return out

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is the gathered input, world * m * k elements (the nccl-tests all-gather size)."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        k, n = int(params.pop("k", 256)), int(params.pop("n", 256))
        m = max(1, size_bytes // (world * k * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[m, k, n], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        m, k, _ = (int(s) for s in case.shape)
        return world * m * k * _elem(case.dtype)

    def flops(self, case, world):
        m, k, n = (int(s) for s in case.shape)
        return 2.0 * world * m * k * n


@register
class MatmulReduceScatter(GoldenOp):
    """`matmul_reduce_scatter(a, b) -> y`: tensor-parallel row-split matmul whose sum is scattered by rows.

    case.shape = [m, k, n]. Rank r holds a_r [world * m, k] and b_r [k, n]; with P = sum_s a_s @ b_s
    ([world * m, n]), rank r returns rows r*m .. (r+1)*m - 1 of P, shape [m, n].
    """

    name = "matmul_reduce_scatter"
    nccl_op = "reduce_scatter"
    functions = ("matmul_reduce_scatter",)

    def validate_case(self, case):
        _check_mkn(case)

    def make_inputs(self, case, rank, world, seed):
        m, k, n = (int(s) for s in case.shape)
        g = generator(seed)
        return {"a": rand([world * m, k], case.dtype, g), "b": rand([k, n], case.dtype, g)}

    def call(self, fns, inputs, case, rank, world):
        y = fns["matmul_reduce_scatter"](inputs["a"], inputs["b"])
        return {"y": expect_tensor(y, "matmul_reduce_scatter's return value")}

    def expected(self, case, world, inputs):
        m = int(case.shape[0])
        total = sum(wide(i["a"]) @ wide(i["b"]) for i in inputs)
        return [{"y": narrow(total[r * m:(r + 1) * m].clone(), case.dtype)} for r in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        m, _, n = (int(s) for s in case.shape)
        out = []
        for r in range(world):
            idx = pick(r, "y", m * n)
            rows, cols = r * m + idx // n, idx % n
            out.append({"y": narrow(sum(_dots(i["a"][rows], i["b"][:, cols]) for i in inputs), case.dtype)})
        return out

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is the partial product each rank reduces, world * m * n elements (the nccl-tests size)."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        k, n = int(params.pop("k", 256)), int(params.pop("n", 256))
        m = max(1, size_bytes // (world * n * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[m, k, n], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        m, _, n = (int(s) for s in case.shape)
        return world * m * n * _elem(case.dtype)

    def flops(self, case, world):
        m, k, n = (int(s) for s in case.shape)
        return 2.0 * world * m * k * n


@register
class VocabParallelCrossEntropy(GoldenOp):
    """`vocab_parallel_cross_entropy(logits_shard, targets) -> loss`: softmax cross-entropy over a sharded vocabulary.

    case.shape = [B, v]: rank r holds logits[:, r*v:(r+1)*v] of a [B, world*v] logit matrix; every rank gets the same
    targets [B] (int64 in [0, world*v)). Every rank returns loss[b] = logsumexp(logits[b, :]) - logits[b, targets[b]].
    params: target_seed (int, default 0; shared by all ranks), scale (default 1) and shift (default 0): logits are
    N(0, 1) * scale + shift; rank_shift (default 0): rank r's shard is further shifted by rank_shift * r.
    """

    name = "vocab_parallel_cross_entropy"
    nccl_op = None  # the metric bytes are the logit shard, not what the all-reduces move
    functions = ("vocab_parallel_cross_entropy",)

    def validate_case(self, case):
        if len(case.shape) != 2 or any(int(s) < 1 for s in case.shape):
            raise ValueError(f"shape must be [batch, vocab_per_rank] with both >= 1, got {case.shape}")
        if not to_dtype(case.dtype).is_floating_point:
            raise ValueError(f"dtype must be a floating type, got {case.dtype}")
        ts = case.params.get("target_seed", 0)
        if isinstance(ts, bool) or not isinstance(ts, int):
            raise ValueError(f"params.target_seed must be an integer, got {ts!r}")
        for key in ("scale", "shift", "rank_shift"):
            v = case.params.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"params.{key} must be a number, got {v!r}")

    def targets(self, case, world: int) -> torch.Tensor:
        b, v = (int(s) for s in case.shape)
        seed = (int(case.params.get("target_seed", 0)) * 1_000_003 + world * 10_007 + b * 101 + v) & 0x7FFF_FFFF
        return torch.randint(0, world * v, (b,), generator=generator(seed), dtype=torch.int64)

    def make_inputs(self, case, rank, world, seed):
        scale = float(case.params.get("scale", 1.0))
        shift = float(case.params.get("shift", 0.0)) + float(case.params.get("rank_shift", 0.0)) * rank
        z = rand(tuple(int(s) for s in case.shape), torch.float64, generator(seed))
        logits = (z * scale + shift).to(to_dtype(case.dtype))
        return {"logits_shard": logits, "targets": self.targets(case, world)}

    def call(self, fns, inputs, case, rank, world):
        loss = fns["vocab_parallel_cross_entropy"](inputs["logits_shard"], inputs["targets"])
        return {"loss": expect_tensor(loss, "vocab_parallel_cross_entropy's return value")}

    def expected(self, case, world, inputs):
        return [{"loss": self._loss(case, inputs, slice(None))} for _ in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        """Only the sampled rows' log-sum-exp."""
        b = int(case.shape[0])
        return [{"loss": self._loss(case, inputs, pick(r, "loss", b))} for r in range(world)]

    def _loss(self, case, inputs, rows) -> torch.Tensor:
        full = torch.cat([wide(i["logits_shard"][rows]) for i in inputs], dim=1)
        t = inputs[0]["targets"][rows]
        loss = torch.logsumexp(full, dim=1) - full.gather(1, t.view(-1, 1)).view(-1)
        return narrow(loss, case.dtype)

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is one rank's logit shard, B * vocab_per_rank elements."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        v = int(params.pop("vocab_per_rank", 2048))
        b = max(1, size_bytes // (v * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[b, v], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        b, v = (int(s) for s in case.shape)
        return b * v * _elem(case.dtype)


@functools.lru_cache(maxsize=4)
def _shared_tensors(seed: int, t: int, d: int, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Drawn once per shape: every rank's inputs of every call hold the same residual (64 MiB at the largest
    benchmark size), and drawing it again for each was half the cost of making a call's inputs."""
    g = generator(seed)
    return rand([t, d], dtype, g), rand([d], dtype, g)


@register
class AllReduceResidualRMSNorm(GoldenOp):
    """`allreduce_residual_rmsnorm(x, residual, weight, eps) -> y`: the tensor-parallel block epilogue.

    case.shape = [T, d]. Rank r holds its partial activations x_r [T, d] (random, its own seed); every rank holds
    the same residual [T, d] and norm weight [d], drawn from `params.shared_seed` (int, default 0), the world
    size and the shape, so all ranks and the coordinator agree on them. With h = sum_r x_r + residual, every rank
    returns y = h / sqrt(mean(h * h, last dim) + eps) * weight, shape [T, d]. eps = `params.eps_e9` * 1e-9
    (an integer, so that cuda tasks can pass it through cb_args.params; default 1000, i.e. eps = 1e-6).
    nccl-tests size: the all-reduced tensor, T * d elements.
    """

    name = "allreduce_residual_rmsnorm"
    nccl_op = "all_reduce"
    functions = ("allreduce_residual_rmsnorm",)

    def validate_case(self, case):
        if len(case.shape) != 2 or any(int(s) < 1 for s in case.shape):
            raise ValueError(f"shape must be [tokens, hidden] with both >= 1, got {case.shape}")
        if not to_dtype(case.dtype).is_floating_point:
            raise ValueError(f"dtype must be a floating type, got {case.dtype}")
        unknown = set(case.params) - {"shared_seed", "eps_e9"}
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)} (known: shared_seed, eps_e9)")
        for key in ("shared_seed", "eps_e9"):
            v = case.params.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"params.{key} must be an integer, got {v!r}")
        if int(case.params.get("eps_e9", 1000)) < 1:
            raise ValueError("params.eps_e9 must be >= 1 (eps in units of 1e-9)")

    @staticmethod
    def eps(case) -> float:
        return int(case.params.get("eps_e9", 1000)) * 1e-9

    def shared(self, case, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual and weight every rank holds (fresh copies: a caller may hand them to candidate code)."""
        t, d = (int(s) for s in case.shape)
        seed = (int(case.params.get("shared_seed", 0)) * 1_000_003 + world * 10_007 + t * 101 + d) & 0x7FFF_FFFF
        residual, weight = _shared_tensors(seed, t, d, case.dtype)
        return residual.clone(), weight.clone()

    def make_inputs(self, case, rank, world, seed):
        residual, weight = self.shared(case, world)
        return {"x": rand(case.shape, case.dtype, generator(seed)), "residual": residual, "weight": weight}

    def call(self, fns, inputs, case, rank, world):
        y = fns["allreduce_residual_rmsnorm"](inputs["x"], inputs["residual"], inputs["weight"], self.eps(case))
        return {"y": expect_tensor(y, "allreduce_residual_rmsnorm's return value")}

    def expected(self, case, world, inputs):
        return [{"y": self._normed_rows(case, inputs, slice(None))} for _ in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        """Only the rows that hold a sampled position are reduced and normalised."""
        t, d = (int(s) for s in case.shape)
        out = []
        for r in range(world):
            idx = pick(r, "y", t * d)
            rows, where = torch.unique(idx // d, return_inverse=True)
            out.append({"y": self._normed_rows(case, inputs, rows)[where, idx % d]})
        return out

    def _normed_rows(self, case, inputs, rows) -> torch.Tensor:
        h = torch.stack([wide(i["x"][rows]) for i in inputs]).sum(0) + wide(inputs[0]["residual"][rows])
        y = h * torch.rsqrt((h * h).mean(dim=-1, keepdim=True) + self.eps(case)) * wide(inputs[0]["weight"])
        return narrow(y, case.dtype)

    def size_case(self, perf, size_bytes, world):
        """`size_bytes` is the all-reduced tensor, T * d elements; d comes from perf params (default 4096)."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        d = int(params.pop("d", 4096))
        t = max(1, size_bytes // (d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[t, d], dtype=perf.dtype, params=params)

    def flops(self, case, world):
        t, d = (int(s) for s in case.shape)
        return float(t * d * (world + 5))  # adds of the reduction, residual, square-sum, scale, weight
