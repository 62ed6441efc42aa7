"""The golden op of fusion/dispatch_grouped_gemm (commbench_env/golden/cuda_moe_gemm.py), on small hand-made cases."""

from __future__ import annotations

import pytest
import torch

from commbench_env.cards import CaseSpec, PerformanceSpec
from commbench_env.golden import get_op


def _case(shape, dtype="bfloat16", **params):
    params.setdefault("experts_per_rank", 2)
    params.setdefault("topk", 2)
    return CaseSpec(name="t", shape=list(shape), dtype=dtype, params=params)


def test_prompt_example_order_and_values():
    op = get_op("moe_dispatch_grouped_gemm")
    case = _case([2, 64, 64])
    gen = torch.Generator().manual_seed(0)
    x = [torch.randn((2, 64), generator=gen).to(torch.bfloat16) for _ in range(2)]
    w = [torch.randn((2, 64, 64), generator=gen).to(torch.bfloat16) for _ in range(2)]
    ids = [torch.tensor([[0, 3], [1, -1]]), torch.tensor([[2, 3], [0, 2]])]
    inputs = [{"x": x[r], "topk_idx": ids[r], "w": w[r]} for r in range(2)]
    exp = op.expected(case, 2, inputs)
    d = lambda a, b: a.double() @ b.double()  # noqa: E731
    want0 = torch.stack([d(x[0][0], w[0][0]), d(x[1][1], w[0][0]), d(x[0][1], w[0][1])])
    want1 = torch.stack([d(x[1][0], w[1][0]), d(x[1][1], w[1][0]), d(x[0][0], w[1][1]), d(x[1][0], w[1][1])])
    assert torch.allclose(exp[0]["y"], want0)
    assert torch.allclose(exp[1]["y"], want1)


def test_samples_match_expected_and_routing_is_shared():
    op = get_op("moe_dispatch_grouped_gemm")
    case = _case([37, 128, 64], "float16", experts_per_rank=3, topk=3, drop=0.2, routing_seed=4)
    world = 3
    inputs = [op.make_inputs(case, r, world, 100 + r) for r in range(world)]
    again = [op.make_inputs(case, r, world, 900 + r) for r in range(world)]
    for a, b in zip(inputs, again):  # routing from public case data; x and w from the private seed
        assert torch.equal(a["topk_idx"], b["topk_idx"])
        assert not torch.equal(a["x"], b["x"])
        assert a["w"].shape == (3, 128, 64)
    exp = op.expected(case, world, inputs)
    entries = sum(int((i["topk_idx"] >= 0).sum()) for i in inputs)
    assert sum(int(e["y"].shape[0]) for e in exp) == entries
    g = torch.Generator().manual_seed(1)
    picked = {}

    def pick(rank, name, numel):
        empty = torch.zeros(0, dtype=torch.int64)
        picked[rank] = torch.randint(0, max(numel, 1), (50,), generator=g) if numel else empty
        return picked[rank]

    samples = op.expected_samples(case, world, inputs, pick)
    for r in range(world):
        assert torch.allclose(samples[r]["y"], exp[r]["y"].reshape(-1)[picked[r]], rtol=1e-12, atol=1e-12)


def test_target_rank_leaves_others_empty():
    op = get_op("moe_dispatch_grouped_gemm")
    case = _case([20, 64, 64], experts_per_rank=2, topk=2, target_rank=0)
    inputs = [op.make_inputs(case, r, 2, r) for r in range(2)]
    exp = op.expected(case, 2, inputs)
    assert exp[1]["y"].shape == (0, 64) and exp[0]["y"].shape[0] > 0


@pytest.mark.parametrize("shape,params", [([4, 100, 64], {}), ([4, 64, 96], {}), ([0, 64, 64], {}),
                                           ([4, 64, 64], {"experts_per_rank": 33}), ([4, 64], {})])
def test_bad_cases_are_refused(shape, params):
    with pytest.raises(ValueError):
        get_op("moe_dispatch_grouped_gemm").validate_case(_case(shape, **params))


def test_size_case_and_flops():
    op = get_op("moe_dispatch_grouped_gemm")
    perf = PerformanceSpec(metric="tflops", sizes=[1 << 20], dtype="bfloat16",
                           params={"hidden": 2048, "ffn": 1024, "experts_per_rank": 8, "topk": 4, "skew": 0.0})
    case = op.size_case(perf, 16 << 20, 2)
    assert case.shape == [4096, 2048, 1024]
    op.validate_case(case)
    assert op.metric_bytes(case, 2) == 16 << 20
    assert op.flops(case, 2) == pytest.approx(2.0 * 2048 * 1024 * 4096 * 4)  # no masked entries
