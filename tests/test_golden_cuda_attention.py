"""Golden ops of commbench_env/golden/cuda_attention.py on small hand-made examples (CPU only)."""

from __future__ import annotations

import math

import pytest
import torch

from commbench_env.cards import CaseSpec
from commbench_env.golden import get_op


def _case(shape, dtype="bfloat16", **params):
    return CaseSpec(name="t", shape=list(shape), dtype=dtype, params=params)


# ---- ring_attention_kernel -----------------------------------------------------------------------------------
def test_ring_attention_kernel_hand_example():
    """world 2, n = 1, one head: out = softmax over both ranks' keys of q . k / 8, lse its log-sum-exp."""
    op = get_op("ring_attention_kernel")
    case = _case([1, 1, 64], "float16", kv_heads=1)
    q0 = torch.zeros(1, 1, 64); q0[0, 0, 0] = 8.0
    q1 = torch.zeros(1, 1, 64); q1[0, 0, 1] = 8.0
    k0 = torch.zeros(1, 1, 64); k0[0, 0, 0] = 1.0  # s(q0, k0) = 1, s(q1, k0) = 0
    k1 = torch.zeros(1, 1, 64); k1[0, 0, 1] = 2.0  # s(q0, k1) = 0, s(q1, k1) = 2
    v0 = torch.full((1, 1, 64), 1.0)
    v1 = torch.full((1, 1, 64), -1.0)
    inputs = [{"q": q0.half(), "k": k0.half(), "v": v0.half()}, {"q": q1.half(), "k": k1.half(), "v": v1.half()}]
    exp = op.expected(case, 2, inputs)
    e = math.e
    assert exp[0]["out"][0, 0, 0].item() == pytest.approx((e - 1) / (e + 1))
    assert exp[0]["lse"][0, 0].item() == pytest.approx(math.log(e + 1))
    assert exp[1]["out"][0, 0, 5].item() == pytest.approx((1 - e * e) / (1 + e * e))
    assert exp[1]["lse"][0, 0].item() == pytest.approx(math.log(1 + e * e))
    assert exp[0]["out"].dtype == torch.float64 and exp[0]["out"].shape == (1, 1, 64)


def test_ring_attention_kernel_gqa_matches_direct_softmax():
    op = get_op("ring_attention_kernel")
    case = _case([5, 4, 64], "bfloat16", kv_heads=2, q_scale=3.0, key_drift=2.0)
    world = 3
    inputs = [op.make_inputs(case, r, world, 100 + r) for r in range(world)]
    assert inputs[1]["q"].shape == (5, 4, 64) and inputs[1]["k"].shape == (5, 2, 64)
    assert inputs[0]["q"].dtype == torch.bfloat16
    exp = op.expected(case, world, inputs)
    k = torch.cat([i["k"].double() for i in inputs])  # [15, 2, 64]
    v = torch.cat([i["v"].double() for i in inputs])
    for r in range(world):
        for h in range(4):
            s = inputs[r]["q"][:, h].double() @ k[:, h // 2].T / 8.0  # no causal mask
            assert torch.allclose(exp[r]["out"][:, h], torch.softmax(s, 1) @ v[:, h // 2], atol=1e-12)
            assert torch.allclose(exp[r]["lse"][:, h], torch.logsumexp(s, 1), atol=1e-12)
    # sampled checks agree with the full expectation
    picks = {}

    def pick(rank, name, numel):
        picks[(rank, name)] = torch.randint(0, numel, (7,), generator=torch.Generator().manual_seed(rank))
        return picks[(rank, name)]

    samples = op.expected_samples(case, world, inputs, pick)
    for r in range(world):
        assert torch.allclose(samples[r]["out"], exp[r]["out"].reshape(-1)[picks[(r, "out")]])
        assert torch.allclose(samples[r]["lse"], exp[r]["lse"].reshape(-1)[picks[(r, "lse")]])


@pytest.mark.parametrize("shape,dtype,params,msg", [
    ([8, 2, 32], "bfloat16", {"kv_heads": 2}, "head_dim must be 64"),
    ([8, 2, 64], "float32", {"kv_heads": 2}, "dtype"),
    ([8, 3, 64], "bfloat16", {"kv_heads": 2}, "must divide"),
    ([8, 2, 64], "bfloat16", {}, "kv_heads is required"),
    ([8, 2, 64], "bfloat16", {"kv_heads": 2, "causal": True}, "unknown params"),
    ([0, 2, 64], "bfloat16", {"kv_heads": 2}, "tokens_per_rank"),
])
def test_ring_attention_kernel_rejects_bad_cases(shape, dtype, params, msg):
    with pytest.raises(ValueError, match=msg):
        get_op("ring_attention_kernel").validate_case(_case(shape, dtype, **params))


def test_ring_attention_kernel_flops_and_bench_case():
    from commbench_env.cards import load_task

    op = get_op("ring_attention_kernel")
    card = load_task("fusion/ring_attention_kernel").card
    bench = op.size_case(card.performance, 2 << 20, 4)
    assert bench.shape == [2048, 8, 64] and bench.params == {"kv_heads": 8}
    op.validate_case(bench)
    assert op.flops(bench, 4) == 4.0 * 2048 * (4 * 2048) * 8 * 64
    assert op.metric_bytes(bench, 4) == 2 << 20


# ---- allreduce_bias_gelu ---------------------------------------------------------------------------------------
def test_bias_gelu_hand_example():
    """The prompt's example: h = [[2, -2]] gives y = [[1.9545, -0.0455]] on every rank."""
    op = get_op("allreduce_bias_gelu")
    case = _case([1, 2], "float32")
    inputs = [{"x": torch.tensor([[1.0, -1.0]]), "bias": torch.tensor([0.5, 1.0])},
              {"x": torch.tensor([[0.5, -2.0]]), "bias": torch.tensor([0.5, 1.0])}]
    exp = op.expected(case, 2, inputs)
    phi2 = 0.5 * (1 + math.erf(2 / math.sqrt(2)))
    assert exp[0]["y"][0, 0].item() == pytest.approx(2 * phi2, abs=1e-12)
    assert exp[1]["y"][0, 1].item() == pytest.approx(-2 * (1 - phi2), abs=1e-12)
    assert round(exp[0]["y"][0, 0].item(), 4) == 1.9545 and round(exp[0]["y"][0, 1].item(), 4) == -0.0455


def test_bias_gelu_tail_is_accurate():
    """Far in the negative tail 1 + erf cancels; the golden's erfc form keeps relative accuracy."""
    from commbench_env.golden.cuda_attention import gelu_erf

    h = torch.tensor([-10.0], dtype=torch.float64)
    want = -10.0 * 0.5 * math.erfc(10.0 / math.sqrt(2))
    assert gelu_erf(h).item() == pytest.approx(want, rel=1e-12)


def test_bias_gelu_inputs_and_samples():
    op = get_op("allreduce_bias_gelu")
    case = _case([3, 7], "bfloat16", shared_seed=4, x_scale=4.0)
    world = 3
    inputs = [op.make_inputs(case, r, world, 7 + r) for r in range(world)]
    assert all(torch.equal(i["bias"], inputs[0]["bias"]) for i in inputs)  # the same bias on every rank
    assert not torch.equal(inputs[0]["x"], inputs[1]["x"])  # private partial outputs
    assert inputs[0]["x"].dtype == torch.bfloat16 and inputs[0]["bias"].shape == (7,)
    exp = op.expected(case, world, inputs)
    h = sum(i["x"].double() for i in inputs) + inputs[0]["bias"].double()
    assert torch.allclose(exp[2]["y"], 0.5 * h * (1 + torch.erf(h / math.sqrt(2))), atol=1e-12)
    idx = torch.tensor([0, 6, 7, 20])
    samples = op.expected_samples(case, world, inputs, lambda r, name, numel: idx)
    assert torch.allclose(samples[1]["y"], exp[1]["y"].reshape(-1)[idx])


def test_bias_gelu_rejects_bad_cases():
    op = get_op("allreduce_bias_gelu")
    with pytest.raises(ValueError, match="dtype"):
        op.validate_case(_case([2, 2], "float16"))
    with pytest.raises(ValueError, match="unknown params"):
        op.validate_case(_case([2, 2], "float32", eps=1))
    with pytest.raises(ValueError, match="shape"):
        op.validate_case(_case([4], "float32"))
