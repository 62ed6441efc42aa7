"""Golden op of commbench_env/golden/cuda_ep_ll.py (ep_low_latency_combine_slots): the prompt's example, plain
loops written from the prompt's definition, the layout against the low-latency dispatch's golden outputs, and the
sampled expectation of timed calls."""

from __future__ import annotations

import math

import pytest
import torch

from commbench_env.cards import CaseSpec, load_task
from commbench_env.golden import get_op

NAN = float("nan")


def _case(shape, dtype="float32", **params) -> CaseSpec:
    return CaseSpec(name="t", shape=list(shape), dtype=dtype, params=params)


def test_prompt_example():
    """world 2, epr 1, M 2, k 2: rank 0 has topk_idx [[1, 0], [1, -1]], rank 1 has no tokens."""
    op = get_op("ep_low_latency_combine_slots")
    case = _case([2, 3], experts_per_rank=1, topk=2)
    y0 = torch.tensor([[[1.0, 2.0, 3.0], [NAN] * 3, [NAN] * 3, [NAN] * 3]])
    y1 = torch.tensor([[[10.0, 20.0, 30.0], [100.0, 200.0, 300.0], [NAN] * 3, [NAN] * 3]])
    inputs = [
        {"expert_y": y0, "slot_count": torch.tensor([[1, 0]]), "slot_src_idx": torch.tensor([[0, -1, -1, -1]]),
         "topk_idx": torch.tensor([[1, 0], [1, -1]]), "topk_weights": torch.tensor([[0.5, 0.25], [1.0, NAN]])},
        {"expert_y": y1, "slot_count": torch.tensor([[2, 0]]), "slot_src_idx": torch.tensor([[0, 1, -1, -1]]),
         "topk_idx": torch.zeros((0, 2), dtype=torch.int64), "topk_weights": torch.zeros((0, 2))},
    ]
    out = op.expected(case, 2, inputs)
    want = torch.tensor([[0.5 * 10 + 0.25 * 1, 0.5 * 20 + 0.25 * 2, 0.5 * 30 + 0.25 * 3], [100.0, 200.0, 300.0]],
                        dtype=torch.float64)
    assert torch.equal(out[0]["combined_x"], want)
    assert list(out[1]["combined_x"].shape) == [0, 3]


@pytest.mark.parametrize("world,params", [
    (2, dict(experts_per_rank=2, topk=2, min_tokens=0)),
    (3, dict(experts_per_rank=2, topk=3, drop=0.3, min_tokens=1, routing_seed=4)),
    (4, dict(experts_per_rank=1, topk=6, target_rank=1, routing_seed=2)),
    (3, dict(experts_per_rank=2, topk=2, idle_rank=2, empty_rank=0, routing_seed=5)),
])
def test_matches_plain_loops_through_the_slot_inputs(world, params):
    """The golden output against loops that find each row through the slot_src_idx inputs (the prompt's reading);
    the layout inputs are those of the dispatch; padding rows are NaN and masked weights NaN."""
    op = get_op("ep_low_latency_combine_slots")
    case = _case([7, 5], **params)
    m, d, epr, k = 7, 5, params["experts_per_rank"], params["topk"]
    inputs = [op.make_inputs(case, r, world, 31 + r) for r in range(world)]
    out = op.expected(case, world, inputs)
    for r, inp in enumerate(inputs):
        assert list(inp["expert_y"].shape) == [epr, world * m, d]
        valid = inp["slot_src_idx"] >= 0
        assert torch.equal(valid.sum(1).view(epr, 1).expand(epr, 1), inp["slot_count"].sum(1, keepdim=True))
        assert torch.isnan(inp["expert_y"][~valid]).all() and not torch.isnan(inp["expert_y"][valid]).any()
        masked = inp["topk_idx"] < 0
        assert torch.isnan(inp["topk_weights"][masked]).all() and not torch.isnan(inp["topk_weights"][~masked]).any()
    for s in range(world):
        ids, w = inputs[s]["topk_idx"], inputs[s]["topk_weights"]
        for i in range(int(ids.shape[0])):
            want = [0.0] * d
            for j in range(k):
                e = int(ids[i, j])
                if e < 0:
                    continue
                r, l = divmod(e, epr)
                src = inputs[r]["slot_src_idx"][l, s * m:(s + 1) * m].tolist()
                p = src.index(i)
                assert p < int(inputs[r]["slot_count"][l, s])
                for c in range(d):
                    want[c] += float(w[i, j]) * float(inputs[r]["expert_y"][l, s * m + p, c])
            for c in range(d):
                assert math.isclose(float(out[s]["combined_x"][i, c]), want[c], rel_tol=1e-12, abs_tol=1e-12)


def test_layout_is_the_low_latency_dispatch_output():
    """slot_count / slot_src_idx are what ep_low_latency_dispatch_slots writes for the same routing."""
    op = get_op("ep_low_latency_combine_slots")
    disp = get_op("ep_low_latency_dispatch_slots")
    case = _case([6, 4], experts_per_rank=2, topk=3, min_tokens=0, routing_seed=3)
    world = 3
    routes = op.routing(case, world)
    d_inputs = [{"x": torch.randn(int(ids.shape[0]), 4), "topk_idx": ids} for ids in routes]
    d_out = disp.expected(case, world, d_inputs)
    for r in range(world):
        inp = op.make_inputs(case, r, world, 5 + r)
        assert torch.equal(inp["topk_idx"], routes[r])
        assert torch.equal(inp["slot_count"], d_out[r]["recv_count"])
        assert torch.equal(inp["slot_src_idx"], d_out[r]["recv_src_idx"])


def test_routing_is_public_and_payload_private():
    op = get_op("ep_low_latency_combine_slots")
    case = _case([9, 3], experts_per_rank=2, topk=2, min_tokens=0)
    a, b = op.make_inputs(case, 1, 2, 1), op.make_inputs(case, 1, 2, 2)
    for name in ("topk_idx", "slot_count", "slot_src_idx"):
        assert torch.equal(a[name], b[name])
    valid = a["slot_src_idx"] >= 0
    assert bool(valid.any()) and not torch.equal(a["expert_y"][valid], b["expert_y"][valid])


def test_samples_match_expected():
    op = get_op("ep_low_latency_combine_slots")
    case = _case([12, 9], "bfloat16", experts_per_rank=2, topk=3, drop=0.2, min_tokens=2)
    world = 3
    inputs = [op.make_inputs(case, r, world, 3 + r) for r in range(world)]
    full = op.expected(case, world, inputs)
    gen = torch.Generator().manual_seed(0)
    picked = {}

    def pick(rank, name, numel):
        idx = torch.randint(0, max(numel, 1), (17,), generator=gen) if numel else torch.zeros(0, dtype=torch.int64)
        picked[(rank, name)] = idx
        return idx

    samples = op.expected_samples(case, world, inputs, pick)
    for r in range(world):
        idx = picked[(r, "combined_x")]
        assert torch.allclose(samples[r]["combined_x"], full[r]["combined_x"].reshape(-1)[idx], rtol=1e-12, atol=1e-12)


def test_benchmark_case_and_card():
    t = load_task("ep/low_latency_combine_cuda")
    op = get_op(t.card.semantics.op)
    case = op.size_case(t.card.performance, 1835008, 4)
    assert case.shape == [128, 7168] and case.params["min_tokens"] == 128
    assert op.metric_bytes(case, 4) == 1835008
    inputs = op.make_inputs(case, 0, 4, 1)
    scratch = max(t.card.cuda.scratch_bytes, int(t.card.cuda.scratch_per_input * inputs["expert_y"].numel() * 2))
    assert scratch >= inputs["expert_y"].numel() * 2 + (1 << 20)  # the prompt's promise: E * M * d * esz + 1 MiB
    for c in t.card.cases:  # every case keeps the promise too
        y_bytes = 8 * c.params["experts_per_rank"] * c.shape[0] * c.shape[1] * (4 if c.dtype == "float32" else 2)
        assert max(t.card.cuda.scratch_bytes, int(t.card.cuda.scratch_per_input * y_bytes)) >= y_bytes + (1 << 20)


def test_expert_migration_card_reuses_expert_rebalance():
    t = load_task("ep/expert_migration_cuda")
    op = get_op(t.card.semantics.op)
    case = op.size_case(t.card.performance, 67108864, 4)
    assert case.shape == [32, 1048576] and op.metric_bytes(case, 4) == 67108864
