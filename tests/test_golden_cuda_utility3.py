"""Golden ops of utility/verified_transfer (verified_ring_shift) and utility/distributed_topk (distributed_topk),
checked on the CPU against the prompts' examples, plain-Python computations, and a Python model of each reference
kernel's algorithm (issue #23)."""

from __future__ import annotations

import struct

import pytest
import torch

from commbench_env.cards import CaseSpec, PerformanceSpec, load_task
from commbench_env.golden import get_op
from commbench_env.golden.cuda_utility3 import chunk_checksums


def _inputs(op, case, world):
    return [op.make_inputs(case, r, world, 777 + 13 * r) for r in range(world)]


# ---- verified_ring_shift ---------------------------------------------------------------------------------------
def _u32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


def test_checksum_prompt_example():
    s = chunk_checksums(torch.tensor([1, 2, 3, 4, 5], dtype=torch.uint8))
    assert s.dtype == torch.int32 and s.tolist() == [[0x04030206, 0x0403020B]]


def _by_hand(x: torch.Tensor) -> list[list[int]]:
    data = x.contiguous().reshape(-1).view(torch.uint8).tolist()
    out = []
    for lo in range(0, len(data), 4096):
        chunk = bytes(data[lo:lo + 4096])
        chunk += b"\0" * (-len(chunk) % 4)
        words = struct.unpack(f"<{len(chunk) // 4}I", chunk)
        s0 = sum(words) % (1 << 32)
        s1 = sum((j + 1) * w for j, w in enumerate(words)) % (1 << 32)
        out.append([_u32(s0), _u32(s1)])
    return out


@pytest.mark.parametrize("shape,dtype", [([1], "float32"), ([5], "bfloat16"), ([7, 13], "uint8"),
                                         ([1024], "float32"), ([4097], "float32"), ([1025], "int64"),
                                         ([3, 1365], "float16")])
def test_checksums_match_a_plain_computation(shape, dtype):
    op = get_op("verified_ring_shift")
    case = CaseSpec(name="c", shape=shape, dtype=dtype, int_range=[0, 256] if dtype == "uint8" else None)
    inputs = _inputs(op, case, 3)
    exp = op.expected(case, 3, inputs)
    for r in range(3):
        left = inputs[(r - 1) % 3]["x"]
        assert torch.equal(exp[r]["y"], left)
        assert exp[r]["sums"].tolist() == _by_hand(left)


def test_kernel_lane_mapping_gives_the_checksum():
    """The reference's warp mapping (lane l, load u: 16-byte word l + 32 u, 32-bit words 4 (l + 32 u) .. + 3)."""
    x = torch.randint(0, 1 << 31, (1024,), dtype=torch.int64, generator=torch.Generator().manual_seed(3))
    w = [int(v) for v in x.tolist()]  # one chunk of 1024 words
    s0 = s1 = 0
    for lane in range(32):
        for u in range(8):
            j = 4 * (lane + 32 * u)
            s0 += sum(w[j:j + 4])
            s1 += sum((j + 1 + e) * w[j + e] for e in range(4))
    got = chunk_checksums(x.to(torch.int32))
    assert got.tolist() == [[_u32(s0 % (1 << 32)), _u32(s1 % (1 << 32))]]


def test_verified_samples_match_expected():
    op = get_op("verified_ring_shift")
    case = CaseSpec(name="c", shape=[3 * 1024 + 7], dtype="bfloat16")
    inputs = _inputs(op, case, 2)
    exp = op.expected(case, 2, inputs)
    asked = {}

    def pick(r, name, numel):
        asked[(r, name)] = torch.randint(0, numel, (41,), generator=torch.Generator().manual_seed(r + len(name)))
        return asked[(r, name)]

    got = op.expected_samples(case, 2, inputs, pick)
    for r in range(2):
        for name in ("sums", "y"):
            assert torch.equal(got[r][name], exp[r][name].reshape(-1)[asked[(r, name)]])


def test_verified_card_shapes():
    task = load_task("utility/verified_transfer")
    op = get_op(task.card.semantics.op)
    bench = op.size_case(task.card.performance, 1 << 20, 2)
    assert bench.shape == [1 << 18] and op.metric_bytes(bench, 2) == 1 << 20
    with pytest.raises(ValueError):
        op.validate_case(CaseSpec(name="c", shape=[0], dtype="float32"))


# ---- distributed_topk ------------------------------------------------------------------------------------------
def _topk_case(n, k, dtype="float32", **params):
    return CaseSpec(name="c", shape=[n], dtype=dtype, params={"topk": k, **params})


def test_topk_prompt_example():
    op = get_op("distributed_topk")
    case = _topk_case(3, 4)
    inputs = [{"x": torch.tensor([0.5, 2.0, -1.0])}, {"x": torch.tensor([2.0, 0.25, 3.0])}]
    for e in op.expected(case, 2, inputs):
        assert e["values"].tolist() == [3.0, 2.0, 2.0, 0.5]
        assert e["indices"].tolist() == [5, 1, 3, 0] and e["indices"].dtype == torch.int64


def test_topk_ties_go_by_global_index():
    op = get_op("distributed_topk")
    case = _topk_case(2048, 100, "bfloat16", levels=1)
    inputs = _inputs(op, case, 4)
    assert all(bool((i["x"] == inputs[0]["x"][0]).all()) for i in inputs)
    exp = op.expected(case, 4, inputs)
    assert exp[0]["indices"].tolist() == list(range(100))


def test_topk_inputs_are_finite_and_non_zero():
    op = get_op("distributed_topk")
    for params in ({}, {"levels": 5}, {"levels": 1}, {"hot_rank": 1}, {"sorted": True}):
        for dtype in ("float32", "bfloat16", "float16"):
            case = _topk_case(5000, 10, dtype, **params)
            for i in _inputs(op, case, 3):
                x = i["x"]
                assert x.dtype == getattr(torch, dtype) and bool(torch.isfinite(x).all()) and not bool((x == 0).any())


def test_topk_hot_rank_and_worlds():
    op = get_op("distributed_topk")
    case = _topk_case(300, 200, "float32", hot_rank=1)
    inputs = _inputs(op, case, 4)
    exp = op.expected(case, 4, inputs)
    assert all(300 <= i < 600 for i in exp[0]["indices"].tolist())
    assert not op.supports_world(2, _topk_case(300, 601)) and op.supports_world(2, _topk_case(300, 600))


def _float_key(v: float) -> int:
    b = struct.unpack("<I", struct.pack("<f", v))[0]
    return (~b & 0xFFFFFFFF) if b & 0x80000000 else b | 0x80000000


def _reference_model(inputs, n, k, world):
    """The reference kernel's algorithm in Python: per rank a 6-pass radix select of the m-th largest
    L = key << 16 | (0xFFFF - i), the m best as G = key << 32 | (0xFFFFFFFF - gidx) sorted descending, then every
    candidate's place in the union from binary searches (bisect on the negated lists)."""
    import bisect

    m = min(k, n)
    lists = []
    for r in range(world):
        keys = [_float_key(float(v)) for v in inputs[r]["x"].to(torch.float32).tolist()]
        ls = [kk << 16 | (0xFFFF - i) for i, kk in enumerate(keys)]
        pre, rem = 0, m
        for d in range(6):
            shift = 40 - 8 * d
            hist = [0] * 256
            for v in ls:
                if d == 0 or v >> (shift + 8) == pre:
                    hist[(v >> shift) & 255] += 1
            above = 0
            for b in range(255, -1, -1):
                if above + hist[b] >= rem:
                    pre, rem = pre << 8 | b, rem - above
                    break
                above += hist[b]
        assert rem == 1
        sel = [keys[i] << 32 | (0xFFFFFFFF - (r * n + i)) for i, v in enumerate(ls) if v >= pre]
        assert len(sel) == m
        lists.append(sorted(sel, reverse=True))
    values, indices = [None] * k, [None] * k
    neg = [[-g for g in ls] for ls in lists]
    for q in range(world):
        for j, g in enumerate(lists[q]):
            place = j + sum(bisect.bisect_left(neg[p], -g) for p in range(world) if p != q)
            if place < k:
                assert values[place] is None
                key = g >> 32
                bits = key & 0x7FFFFFFF if key & 0x80000000 else ~key & 0xFFFFFFFF
                values[place] = struct.unpack("<f", struct.pack("<I", bits))[0]
                indices[place] = 0xFFFFFFFF - (g & 0xFFFFFFFF)
    return values, indices


@pytest.mark.parametrize("n,k,dtype,params,world", [
    (4096, 64, "float32", {}, 2), (1000, 1000, "bfloat16", {}, 2), (777, 1, "float32", {}, 3),
    (1, 2, "float32", {}, 2), (1, 5, "float32", {}, 8), (300, 512, "float16", {}, 2),
    (2048, 100, "bfloat16", {"levels": 1}, 4), (5000, 1024, "float32", {"levels": 5}, 3),
    (3333, 700, "bfloat16", {"hot_rank": 1}, 4), (10000, 257, "float16", {"sorted": True}, 2),
])
def test_reference_algorithm_matches_golden(n, k, dtype, params, world):
    op = get_op("distributed_topk")
    case = _topk_case(n, k, dtype, **params)
    inputs = _inputs(op, case, world)
    exp = op.expected(case, world, inputs)[0]
    values, indices = _reference_model(inputs, n, k, world)
    assert indices == exp["indices"].tolist()
    assert values == exp["values"].tolist()


def test_topk_bench_case():
    task = load_task("utility/distributed_topk")
    op = get_op(task.card.semantics.op)
    perf: PerformanceSpec = task.card.performance
    case = op.size_case(perf, 4096, 2)
    assert case.shape == [1024] and case.params["topk"] == 1024 and op.metric_bytes(case, 2) == 4096
    assert op.size_case(perf, 131072, 8).shape == [32768]
    for c in task.card.cases:
        assert op.supports_world(2, c), c.name
