"""Golden ops of commbench_env/golden/cuda_ep_counts.py (ep_notify_counts, ep_dispatch_expert_major): the prompts'
examples, plain loops written from the prompts' definitions, and a CPU model of the references' index arithmetic."""

from __future__ import annotations

import pytest
import torch

from commbench_env.cards import CaseSpec, PerformanceSpec
from commbench_env.golden import get_op
from commbench_env.golden.cuda_ep_counts import expert_counts


def _case(shape, dtype, **params) -> CaseSpec:
    return CaseSpec(name="t", shape=list(shape), dtype=dtype, params=params)


# ---- ep_notify_counts ----------------------------------------------------------------------------------------------

def test_notify_prompt_example():
    op = get_op("ep_notify_counts")
    case = _case([8], "int32", experts_per_rank=2, topk=2)
    inputs = [{"num_tokens_per_expert": torch.tensor([3, 0, 1, 2], dtype=torch.int32),
               "num_tokens_per_rank": torch.tensor([3, 2], dtype=torch.int32)},
              {"num_tokens_per_expert": torch.tensor([1, 1, 0, 4], dtype=torch.int32),
               "num_tokens_per_rank": torch.tensor([2, 4], dtype=torch.int32)}]
    out = op.expected(case, 2, inputs)
    assert out[1]["expert_offsets"].tolist() == [[0, 0], [1, 2], [1, 6]]
    assert out[1]["rank_offsets"].tolist() == [0, 2, 6]
    assert out[0]["expert_offsets"].tolist() == [[0, 0], [3, 0], [4, 1]]
    assert out[0]["rank_offsets"].tolist() == [0, 3, 5]
    assert all(o[n].dtype == torch.int32 for o in out for n in o)


@pytest.mark.parametrize("world,params", [
    (2, {"experts_per_rank": 2, "topk": 2}),
    (3, {"experts_per_rank": 5, "topk": 4, "drop": 0.3, "skew": 2.0, "routing_seed": 3}),
    (4, {"experts_per_rank": 1, "topk": 3, "idle_rank": 2}),
    (8, {"experts_per_rank": 16, "topk": 8, "target_rank": 5}),
])
def test_notify_matches_loops(world, params):
    op = get_op("ep_notify_counts")
    case = _case([300], "int32", **params)
    op.validate_case(case)
    epr = params["experts_per_rank"]
    inputs = [op.make_inputs(case, r, world, 1000 + r) for r in range(world)]
    for inp in inputs:
        pe, pr = inp["num_tokens_per_expert"], inp["num_tokens_per_rank"]
        assert pe.dtype == pr.dtype == torch.int32 and pe.shape == (world * epr,) and pr.shape == (world,)
        for r in range(world):  # a token counts once per rank: between the largest expert count and their sum
            mine = pe[r * epr:(r + 1) * epr]
            assert int(mine.max()) <= int(pr[r]) <= int(mine.sum())
    out = op.expected(case, world, inputs)
    for r in range(world):
        eo, ro = out[r]["expert_offsets"].tolist(), out[r]["rank_offsets"].tolist()
        assert len(eo) == world + 1 and len(ro) == world + 1
        for s in range(world + 1):
            for lx in range(epr):
                assert eo[s][lx] == sum(int(inputs[q]["num_tokens_per_expert"][r * epr + lx]) for q in range(s))
            assert ro[s] == sum(int(inputs[q]["num_tokens_per_rank"][r]) for q in range(s))


def test_notify_fresh_counts_every_call_and_sizes():
    op = get_op("ep_notify_counts")
    case = _case([4096], "int32", experts_per_rank=32, topk=8, skew=0.0)
    a, b = (op.make_inputs(case, 0, 2, s)["num_tokens_per_expert"] for s in (1, 2))
    assert not torch.equal(a, b)
    perf = PerformanceSpec(metric="latency", sizes=[64, 1024], dtype="int32", params={"tokens": 4096, "topk": 8})
    for world in (2, 4, 8):
        for size, n_exp in ((64, 16), (1024, 256)):
            c = op.size_case(perf, size, world)
            op.validate_case(c)
            assert world * c.params["experts_per_rank"] == n_exp and c.shape == [4096]
            assert op.metric_bytes(c, world) == size


# ---- ep_dispatch_expert_major --------------------------------------------------------------------------------------

def test_expert_major_prompt_example():
    op = get_op("ep_dispatch_expert_major")
    case = _case([3, 2], "float32", experts_per_rank=2, topk=2)
    x0 = torch.arange(6, dtype=torch.float32).view(3, 2)
    x1 = torch.arange(10, 16, dtype=torch.float32).view(3, 2)
    inputs = [{"x": x0, "topk_idx": torch.tensor([[3, 2], [2, -1], [0, 3]])},
              {"x": x1, "topk_idx": torch.tensor([[2, 1], [-1, -1], [0, 2]])}]
    out = op.expected(case, 2, inputs)
    assert out[1]["recv_x"].tolist() == [x0[0].tolist(), x0[1].tolist(), x1[0].tolist(), x1[2].tolist(),
                                         x0[0].tolist(), x0[2].tolist()]
    assert out[0]["recv_x"].tolist() == [x0[2].tolist(), x1[2].tolist(), x1[0].tolist()]


def _loops(inputs, world: int, epr: int, r: int) -> list[tuple[int, int]]:
    """The prompt's order, spelled out: (source, token) of each of rank r's rows."""
    rows = []
    for lx in range(epr):
        for q in range(world):
            ids = inputs[q]["topk_idx"].tolist()
            rows += [(q, i) for i, row in enumerate(ids) if r * epr + lx in row]
    return rows


CASES = [
    (2, [64, 32], "float32", {"experts_per_rank": 2, "topk": 2}),
    (3, [600, 5], "bfloat16", {"experts_per_rank": 5, "topk": 4, "skew": 3.0, "routing_seed": 2}),
    (4, [300, 3], "float16", {"experts_per_rank": 3, "topk": 4, "drop": 0.4, "routing_seed": 3}),
    (2, [50, 4], "float32", {"experts_per_rank": 2, "topk": 2, "drop": 1.0}),
    (2, [40, 4], "float32", {"experts_per_rank": 1, "topk": 8, "idle_rank": 1}),
    (8, [1, 16], "bfloat16", {"experts_per_rank": 2, "topk": 2}),
    (5, [700, 2], "float32", {"experts_per_rank": 7, "topk": 3, "target_rank": 2, "routing_seed": 4}),
]


@pytest.mark.parametrize("world,shape,dtype,params", CASES)
def test_expert_major_matches_loops(world, shape, dtype, params):
    op = get_op("ep_dispatch_expert_major")
    case = _case(shape, dtype, **params)
    op.validate_case(case)
    epr = params["experts_per_rank"]
    inputs = [op.make_inputs(case, r, world, 77 + r) for r in range(world)]
    counts = expert_counts(case, world)
    for q, inp in enumerate(inputs):
        ids = inp["topk_idx"]
        assert torch.equal(inp["counts"], counts)  # the same on every rank
        assert torch.equal(torch.bincount(ids[ids >= 0], minlength=world * epr).to(torch.int32), counts[q])
    out = op.expected(case, world, inputs)
    for r in range(world):
        rows = _loops(inputs, world, epr, r)
        got = out[r]["recv_x"]
        assert got.dtype == inputs[0]["x"].dtype and got.shape == (len(rows), shape[1])
        assert got.shape[0] == int(counts[:, r * epr:(r + 1) * epr].sum())
        for n, (q, i) in enumerate(rows):
            assert torch.equal(got[n], inputs[q]["x"][i])


def test_expert_major_shapes_fixed_but_order_fresh_every_call():
    """Benchmark output shapes come from the first call: the counts must not change between calls, the token order
    must (else a slot computation could be cached across calls)."""
    op = get_op("ep_dispatch_expert_major")
    case = _case([256, 8], "bfloat16", experts_per_rank=4, topk=3, skew=1.0)
    a, b = (op.make_inputs(case, 1, 2, s) for s in (5, 6))
    assert torch.equal(a["counts"], b["counts"])
    assert not torch.equal(a["topk_idx"], b["topk_idx"]) and not torch.equal(a["x"], b["x"])
    ea = op.expected(case, 2, [op.make_inputs(case, r, 2, 5 + 10 * r) for r in range(2)])
    eb = op.expected(case, 2, [op.make_inputs(case, r, 2, 6 + 10 * r) for r in range(2)])
    assert [e["recv_x"].shape for e in ea] == [e["recv_x"].shape for e in eb]


def _reference_rows(inputs, world: int, epr: int, tile: int = 256) -> list[torch.Tensor]:
    """The reference kernels' index arithmetic on the CPU (tiles of `tile` tokens, warps of 32 lanes, bit masks),
    as rows of each receiver holding (source, token) pairs; -1 where nothing was placed."""
    n_exp = world * epr
    counts = torch.stack([torch.bincount(inp["topk_idx"][inp["topk_idx"] >= 0], minlength=n_exp)
                          for inp in inputs])
    tot = counts.sum(0)
    n_recv = [int(tot[r * epr:(r + 1) * epr].sum()) for r in range(world)]
    placed = [torch.full((n, 2), -1, dtype=torch.int64) for n in n_recv]
    for s, inp in enumerate(inputs):
        ids = inp["topk_idx"]
        t, k = ids.shape
        tiles = -(-t // tile)
        hist = torch.zeros((tiles, n_exp), dtype=torch.int64)
        for b in range(tiles):
            blk = ids[b * tile:(b + 1) * tile]
            hist[b] = torch.bincount(blk[blk >= 0], minlength=n_exp)
        for b in range(tiles):
            base = counts[:s].sum(0) + hist[:b].sum(0)
            for r in range(world):  # start(e): earlier experts of the same rank
                seg = tot[r * epr:(r + 1) * epr]
                base[r * epr:(r + 1) * epr] += torch.cumsum(seg, 0) - seg
            masks = torch.zeros((tile // 32, n_exp), dtype=torch.int64)
            for tid in range(min(tile, t - b * tile)):
                for e in ids[b * tile + tid].tolist():
                    if e >= 0:
                        masks[tid // 32, e] |= 1 << (tid % 32)
            for tid in range(min(tile, t - b * tile)):
                i, warp, lane = b * tile + tid, tid // 32, tid % 32
                for e in ids[i].tolist():
                    if e < 0:
                        continue
                    row = int(base[e]) + bin(int(masks[warp, e]) & ((1 << lane) - 1)).count("1")
                    row += sum(bin(int(masks[w, e])).count("1") for w in range(warp))
                    dst = placed[e // epr]
                    assert int(dst[row, 0]) == -1, "two entries got the same row"
                    dst[row] = torch.tensor([s, i])
    return placed


@pytest.mark.parametrize("world,shape,params,tile", [
    (3, [600, 1], {"experts_per_rank": 5, "topk": 4, "skew": 3.0, "routing_seed": 2}, 256),
    (4, [300, 1], {"experts_per_rank": 3, "topk": 4, "drop": 0.4, "routing_seed": 3}, 64),
    (2, [97, 1], {"experts_per_rank": 8, "topk": 12, "routing_seed": 12}, 32),
])
def test_reference_index_arithmetic_gives_the_golden_order(world, shape, params, tile):
    op = get_op("ep_dispatch_expert_major")
    case = _case(shape, "float32", **params)
    inputs = [op.make_inputs(case, r, world, 5 + r) for r in range(world)]
    placed = _reference_rows(inputs, world, params["experts_per_rank"], tile)
    for r in range(world):
        want = _loops(inputs, world, params["experts_per_rank"], r)
        assert [tuple(p) for p in placed[r].tolist()] == [tuple(w) for w in want]


def test_expert_major_size_case():
    op = get_op("ep_dispatch_expert_major")
    perf = PerformanceSpec(metric="algbw", sizes=[16777216], dtype="bfloat16",
                           params={"hidden": 7168, "experts_per_rank": 32, "topk": 8, "skew": 0.0})
    c = op.size_case(perf, 16777216, 2)
    op.validate_case(c)
    assert c.shape == [16777216 // (7168 * 2), 7168]
    assert op.metric_bytes(c, 2) == c.shape[0] * 7168 * 2
