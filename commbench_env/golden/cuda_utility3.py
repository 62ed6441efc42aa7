"""Golden semantics of the third wave of utility CUDA tasks (issue #23).

- `verified_ring_shift`: a ring shift whose receiver also returns a checksum of every 4 KiB chunk it received
  (utility/verified_transfer);
- `distributed_topk`: the global top-k of values sharded over the ranks, with their global indices, on every rank
  (utility/distributed_topk).
"""

from __future__ import annotations

import math
import sys

import torch

from . import register
from .base import GoldenOp, elem_size as _elem, generator, int_param, int_range, rand, to_dtype

CHUNK_BYTES = 4096  # bytes per checksummed chunk
CHUNK_WORDS = CHUNK_BYTES // 4
_MASK32 = 0xFFFF_FFFF
COPY_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "uint8")
TOPK_DTYPES = ("float32", "bfloat16", "float16")
TOPK_MAX_N = 32768  # values per rank
TOPK_MAX_K = 1024


def _as_int32(v: torch.Tensor) -> torch.Tensor:
    """Values in [0, 2^32) (int64) as the int32 with the same 32 bits."""
    v = v & _MASK32
    return torch.where(v >= (1 << 31), v - (1 << 32), v).to(torch.int32)


def _chunk_rows(x: torch.Tensor, chunks: torch.Tensor | None = None) -> torch.Tensor:
    """The bytes of x (row-major) as uint8 [nchunks, 4096] (or only the rows in `chunks`), zero-padded past the
    last byte."""
    b = x.contiguous().reshape(-1).view(torch.uint8)
    nbytes = b.numel()
    full = nbytes // CHUNK_BYTES
    body = b[:full * CHUNK_BYTES].reshape(full, CHUNK_BYTES)
    last = torch.zeros(1 if nbytes % CHUNK_BYTES else 0, CHUNK_BYTES, dtype=torch.uint8)
    if last.shape[0]:
        last[0, :nbytes - full * CHUNK_BYTES] = b[full * CHUNK_BYTES:]
    if chunks is None:
        return torch.cat([body, last]) if last.shape[0] else body
    rows = torch.empty(chunks.numel(), CHUNK_BYTES, dtype=torch.uint8)
    inside = chunks < full
    rows[inside] = body[chunks[inside]]
    if bool((~inside).any()):
        rows[~inside] = last[0]
    return rows


_ROWS_PER_STEP = 2048  # chunks summed at a time (8 MiB of data, 16 MiB of int64 words)


def chunk_checksums(x: torch.Tensor, chunks: torch.Tensor | None = None) -> torch.Tensor:
    """int32 [nchunks, 2]: per 4 KiB chunk of x's bytes (little-endian 32-bit words, zero-padded), the sum of its
    words and the sum of (j + 1) times word j, both mod 2^32 (as int32 bit patterns); only the rows in `chunks`
    when given."""
    assert sys.byteorder == "little"  # the words are the bytes viewed in the host's order
    rows = _chunk_rows(x, chunks)
    weights = torch.arange(1, CHUNK_WORDS + 1, dtype=torch.int64)
    out = torch.empty(rows.shape[0], 2, dtype=torch.int64)
    for lo in range(0, rows.shape[0], _ROWS_PER_STEP):
        w = rows[lo:lo + _ROWS_PER_STEP].contiguous().view(torch.int32).to(torch.int64) & _MASK32
        out[lo:lo + _ROWS_PER_STEP, 0] = w.sum(1)
        out[lo:lo + _ROWS_PER_STEP, 1] = (w * weights).sum(1)  # < 2^51: no overflow
    return _as_int32(out)


def _n_chunks(case) -> int:
    return -(-math.prod(case.shape) * _elem(case.dtype) // CHUNK_BYTES)


@register
class VerifiedRingShift(GoldenOp):
    """`verified_shift(x) -> (y, sums)`: rank r's y is x of rank (r - 1) mod world, bit for bit; `sums` (int32
    [ceil(bytes / 4096), 2]) holds, for every 4 KiB chunk c of y's bytes, s0 = the sum of its little-endian
    uint32 words and s1 = the sum of (j + 1) * word j (j = 0 .. 1023, the word's place in the chunk), both mod
    2^32, stored as int32 bit patterns; the bytes of the last, partial chunk are followed by zeros.

    Any dtype (the transfer never looks at values); integer inputs are drawn from the case's int_range.
    nccl-tests size: the bytes of one x."""

    name = "verified_ring_shift"
    nccl_op = "sendrecv"
    functions = ("verified_shift",)

    def validate_case(self, case):
        if case.dtype not in COPY_DTYPES:
            raise ValueError(f"dtype must be one of {COPY_DTYPES}, got {case.dtype!r}")
        if not case.shape or any(d < 1 for d in case.shape):
            raise ValueError("shape must have at least one dimension, all >= 1")
        if case.params:
            raise ValueError(f"this op takes no params, got {sorted(case.params)}")

    def make_inputs(self, case, rank, world, seed):
        return {"x": rand(case.shape, case.dtype, generator(seed), **int_range(case))}

    def call(self, fns, inputs, case, rank, world):
        raise NotImplementedError("verified_ring_shift is a cuda task: the device host calls the kernel")

    def expected(self, case, world, inputs):
        return [{"y": inputs[(r - 1) % world]["x"].clone(), "sums": chunk_checksums(inputs[(r - 1) % world]["x"])}
                for r in range(world)]

    def expected_samples(self, case, world, inputs, pick):
        numel = math.prod(case.shape)
        nchunks = _n_chunks(case)
        out = []
        for r in range(world):
            x = inputs[(r - 1) % world]["x"]
            # sorted name order within a rank: "sums" before "y"
            idx_s = pick(r, "sums", nchunks * 2)
            idx_y = pick(r, "y", numel)
            rows = idx_s // 2
            uniq, inv = torch.unique(rows, return_inverse=True)
            sums = chunk_checksums(x, uniq)[inv, idx_s % 2]
            out.append({"sums": sums, "y": x.reshape(-1)[idx_y].clone()})
        return out


# ---- distributed top-k ----------------------------------------------------------------------------------------
@register
class DistributedTopk(GoldenOp):
    """`topk(x) -> (values, indices)`: rank r holds x [n] (the same n on every rank); value i of rank r has the
    global index r * n + i. Every rank returns the k largest values of all world * n, in descending order, and
    their global indices (int64); equal values are ordered by their global index, the smaller first. Values are
    copies of inputs: exact.

    Values are finite and never zero. Card params: `topk` (k, 1 .. 1024, at most world * n: other worlds are not
    run), `levels` (values drawn from that many distinct levels, for ties; 1 makes every value equal), `hot_rank`
    (that rank mod world holds larger values than every other rank), `sorted` (each rank's values ascending).
    Benchmark (size_case): n = size / element size, k and the other params from perf.params."""

    name = "distributed_topk"
    nccl_op = None
    functions = ("topk",)
    KNOWN = {"topk", "levels", "hot_rank", "sorted"}

    def validate_case(self, case):
        if case.dtype not in TOPK_DTYPES:
            raise ValueError(f"dtype must be one of {TOPK_DTYPES}, got {case.dtype!r}")
        if len(case.shape) != 1 or not 1 <= case.shape[0] <= TOPK_MAX_N:
            raise ValueError(f"shape must be [n] with 1 <= n <= {TOPK_MAX_N}")
        unknown = set(case.params) - self.KNOWN
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}; known: {sorted(self.KNOWN)}")
        int_param(case, "topk", None, 1, TOPK_MAX_K)
        int_param(case, "levels", 0, 0)
        int_param(case, "hot_rank", 0, 0)
        if not isinstance(case.params.get("sorted", False), bool):
            raise ValueError("params.sorted must be true or false")

    def supports_world(self, world, case):
        return int(case.params["topk"]) <= world * int(case.shape[0])

    def make_inputs(self, case, rank, world, seed):
        g = generator(seed)
        n = int(case.shape[0])
        p = case.params
        levels = int(p.get("levels", 0))
        if levels > 0:
            lv = torch.linspace(-3.0, 3.0, levels + 2)[1:-1] if levels > 1 else torch.tensor([1.5])
            lv = torch.where(lv == 0, torch.full_like(lv, 0.25), lv)
            v = lv[torch.randint(0, levels, (n,), generator=g)]
        else:
            v = torch.randn(n, generator=g)
        if "hot_rank" in p and rank == int(p["hot_rank"]) % world:
            v = v.abs() + 20.0
        x = v.to(to_dtype(case.dtype))
        x = torch.where(x == 0, torch.ones_like(x), x)  # never zero (fp16 flushes tiny values)
        if p.get("sorted", False):
            x = torch.sort(x).values
        return {"x": x.contiguous()}

    def call(self, fns, inputs, case, rank, world):
        raise NotImplementedError("distributed_topk is a cuda task: the device host calls the kernel")

    def expected(self, case, world, inputs):
        k = int(case.params["topk"])
        allv = torch.cat([i["x"].to(torch.float64) for i in inputs])
        order = torch.sort(allv, descending=True, stable=True).indices[:k]  # stable: ties keep index order
        want = {"values": allv[order].clone(), "indices": order.to(torch.int64)}
        return [{k_: v.clone() for k_, v in want.items()} for _ in range(world)]

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        n = max(1, min(TOPK_MAX_N, size_bytes // _elem(perf.dtype)))
        params = dict(perf.params)
        params["topk"] = min(int(params.get("topk", 1024)), world * n)
        case = CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[n], dtype=perf.dtype, params=params)
        self.validate_case(case)
        return case

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * _elem(case.dtype)


__all__ = ["CHUNK_BYTES", "DistributedTopk", "VerifiedRingShift", "chunk_checksums"]
