"""Golden ops of commbench_env/golden/cuda_ep_fusion.py (qk_norm_across_ranks, ep_low_latency_dispatch_slots):
expected outputs against hand-made examples and plain loops written from the prompts' definitions."""

from __future__ import annotations

import math

import pytest
import torch

from commbench_env.cards import CaseSpec, load_task
from commbench_env.golden import get_op


def _case(shape, dtype="float32", **params) -> CaseSpec:
    return CaseSpec(name="t", shape=list(shape), dtype=dtype, params=params)


# ---- qk_norm_across_ranks ------------------------------------------------------------------------------------------

def test_qk_norm_hand_made_example():
    op = get_op("qk_norm_across_ranks")
    case = _case([1, 2, 1], eps_e9=1)  # eps 1e-9
    inputs = [
        {"q": torch.tensor([[3.0, 4.0]]), "k": torch.tensor([[2.0]]), "q_weight": torch.tensor([1.0, 2.0]),
         "k_weight": torch.tensor([1.0])},
        {"q": torch.tensor([[0.0, 0.0]]), "k": torch.tensor([[0.0]]), "q_weight": torch.tensor([1.0, 1.0]),
         "k_weight": torch.tensor([3.0])},
    ]
    out = op.expected(case, 2, inputs)
    # Sq = 25 over world * Dq = 4 columns: rms = 2.5; Sk = 4 over 2 columns: rms = sqrt(2)
    rq, rk = math.sqrt(25 / 4 + 1e-9), math.sqrt(4 / 2 + 1e-9)
    assert torch.allclose(out[0]["q_out"], torch.tensor([[3 / rq, 8 / rq]], dtype=torch.float64))
    assert torch.allclose(out[0]["k_out"], torch.tensor([[2 / rk]], dtype=torch.float64))
    assert torch.equal(out[1]["q_out"], torch.zeros(1, 2, dtype=torch.float64))
    assert torch.equal(out[1]["k_out"], torch.zeros(1, 1, dtype=torch.float64))


@pytest.mark.parametrize("world", [2, 3])
def test_qk_norm_matches_plain_loops(world):
    op = get_op("qk_norm_across_ranks")
    case = _case([5, 7, 3], eps_e9=1000)
    inputs = [op.make_inputs(case, r, world, 11 + r) for r in range(world)]
    out = op.expected(case, world, inputs)
    for r in range(world):
        assert list(inputs[r]["q"].shape) == [5, 7] and list(inputs[r]["k"].shape) == [5, 3]
        for t in range(5):
            for name, width in (("q", 7), ("k", 3)):
                s = sum(float(inputs[p][name][t, j]) ** 2 for p in range(world) for j in range(width))
                inv = 1 / math.sqrt(s / (world * width) + 1e-6)
                for j in range(width):
                    want = float(inputs[r][name][t, j]) * inv * float(inputs[r][name + "_weight"][j])
                    assert abs(float(out[r][name + "_out"][t, j]) - want) < 1e-12


def test_qk_norm_local_statistics_are_not_enough():
    """The per-(rank, token) scales make a norm over the own columns only fail the bfloat16 tolerance."""
    op = get_op("qk_norm_across_ranks")
    case = _case([64, 256, 64], "bfloat16")
    inputs = [op.make_inputs(case, r, 2, 5 + r) for r in range(2)]
    out = op.expected(case, 2, inputs)
    q = inputs[0]["q"].double()
    local = q * torch.rsqrt((q * q).mean(-1, keepdim=True) + 1e-6) * inputs[0]["q_weight"].double()
    bad = ~torch.isclose(local, out[0]["q_out"], rtol=2e-2, atol=2e-2)
    assert bad.float().mean() > 0.5


def test_qk_norm_samples_match_expected():
    op = get_op("qk_norm_across_ranks")
    case = _case([9, 16, 8], "bfloat16")
    world = 2
    inputs = [op.make_inputs(case, r, world, 3 + r) for r in range(world)]
    full = op.expected(case, world, inputs)
    gen = torch.Generator().manual_seed(0)
    picked = {}

    def pick(rank, name, numel):
        idx = torch.randint(0, numel, (13,), generator=gen)
        picked[(rank, name)] = idx
        return idx

    got = op.expected_samples(case, world, inputs, pick)
    for r in range(world):
        for name in ("q_out", "k_out"):
            assert torch.equal(got[r][name], full[r][name].reshape(-1)[picked[(r, name)]])


def test_qk_norm_size_case_and_limits():
    op = get_op("qk_norm_across_ranks")
    card = load_task("fusion/qk_norm_across_ranks").card
    c = op.size_case(card.performance, 64 << 20, 8)
    assert c.shape == [6553, 4096, 1024] and op.metric_bytes(c, 8) <= 64 << 20
    with pytest.raises(ValueError, match="16384"):
        op.validate_case(_case([4, 16000, 1000]))


# ---- ep_low_latency_dispatch_slots ----------------------------------------------------------------------------------

def _example():
    """The prompt's example: world 2, epr 1, M 3."""
    x0 = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    x1 = torch.tensor([[10.0, 11.0]])
    return [{"x": x0, "topk_idx": torch.tensor([[1], [0], [1]])}, {"x": x1, "topk_idx": torch.tensor([[1]])}]


def test_ll_slots_prompt_example():
    op = get_op("ep_low_latency_dispatch_slots")
    case = _case([3, 2], experts_per_rank=1, topk=1)
    out = op.expected(case, 2, _example())
    r1 = out[1]
    assert r1["recv_count"].tolist() == [[2, 1]]
    assert r1["recv_src_idx"].tolist() == [[0, 2, -1, 0, -1, -1]]
    assert r1["recv_x"][0].tolist() == [[0, 1], [4, 5], [0, 0], [10, 11], [0, 0], [0, 0]]
    assert out[0]["recv_count"].tolist() == [[1, 0]]


def test_ll_slots_padding_is_checked():
    op = get_op("ep_low_latency_dispatch_slots")
    case = _case([3, 2], experts_per_rank=1, topk=1)
    inputs = _example()
    exp = op.expected(case, 2, inputs)
    good = [{k: v.clone() for k, v in e.items()} for e in exp]
    assert op.verify(case, 2, inputs, good, (0.0, 0.0)) is None
    assert not op.verifies_whole_outputs()  # sampled checks of timed calls compare against expected: it is whole
    nan_pad = [{k: v.clone() for k, v in e.items()} for e in exp]
    nan_pad[1]["recv_x"][0, 2] = float("nan")  # a padding row left unwritten
    mm = op.verify(case, 2, inputs, nan_pad, (0.0, 0.0))
    assert mm is not None and mm["rank"] == 1 and mm["output"] == "recv_x"
    src_pad = [{k: v.clone() for k, v in e.items()} for e in exp]
    src_pad[1]["recv_src_idx"][0, 5] = 7
    assert op.verify(case, 2, inputs, src_pad, (0.0, 0.0))["output"] == "recv_src_idx"


def test_ll_slots_matches_plain_loops():
    op = get_op("ep_low_latency_dispatch_slots")
    case = _case([12, 3], experts_per_rank=2, topk=3, min_tokens=0, drop=0.2, routing_seed=4)
    world, m, epr = 3, 12, 2
    inputs = [op.make_inputs(case, r, world, 40 + r) for r in range(world)]
    out = op.expected(case, world, inputs)
    for r in range(world):
        for l in range(epr):
            for s in range(world):
                rows = [i for i in range(inputs[s]["x"].shape[0]) if r * epr + l in inputs[s]["topk_idx"][i].tolist()]
                assert int(out[r]["recv_count"][l, s]) == len(rows)
                for pos in range(m):
                    src = out[r]["recv_src_idx"][l, s * m + pos]
                    row = out[r]["recv_x"][l, s * m + pos]
                    if pos < len(rows):
                        assert int(src) == rows[pos] and torch.equal(row, inputs[s]["x"][rows[pos]])
                    else:
                        assert int(src) == -1 and bool((row == 0).all())


def test_ll_slots_limits():
    op = get_op("ep_low_latency_dispatch_slots")
    with pytest.raises(ValueError, match="1024"):
        op.validate_case(_case([2000, 8], experts_per_rank=2, topk=2))
