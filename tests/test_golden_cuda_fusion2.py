"""Golden ops of fusion/matmul_allreduce_decode (matmul_allreduce_decode) and fusion/vocab_embedding_allreduce
(vocab_embedding_allreduce), checked on the CPU against hand-made examples (issue #23)."""

from __future__ import annotations

import pytest
import torch

from commbench_env.cards import CaseSpec, PerformanceSpec, load_task
from commbench_env.golden import get_op

TOL = (2e-2, 2e-2)


def _case(shape, dtype="bfloat16", **params):
    return CaseSpec(name="c", shape=shape, dtype=dtype, params=params)


# ---- matmul_allreduce_decode ------------------------------------------------------------------------------------
def _mm(shape, dtype="bfloat16", **params):
    return _case(shape, dtype, k=shape[1], **params)


def test_matmul_prompt_example():
    op = get_op("matmul_allreduce_decode")
    case = _mm([1, 2, 2])
    bf = torch.bfloat16
    inputs = [{"x": torch.tensor([[1., 2.]], dtype=bf), "w": torch.tensor([[1., 0.], [0., 1.]], dtype=bf)},
              {"x": torch.tensor([[3., 4.]], dtype=bf), "w": torch.tensor([[1., 1.], [2., 0.]], dtype=bf)}]
    exp = op.expected(case, 2, inputs)
    assert [e["y"].tolist() for e in exp] == [[[8.0, 8.0]], [[8.0, 8.0]]]


def test_matmul_inputs_shapes_and_privacy():
    op = get_op("matmul_allreduce_decode")
    case = _mm([5, 96, 7], dtype="float16")
    a, b = op.make_inputs(case, 0, 2, 11), op.make_inputs(case, 1, 2, 12)
    assert a["x"].shape == (5, 96) and a["w"].shape == (7, 96) and a["x"].dtype == torch.float16
    assert not torch.equal(a["w"], b["w"])  # each rank's weights come from its own seed
    assert torch.equal(op.make_inputs(case, 0, 2, 11)["w"], a["w"])


def _outputs(op, case, world, inputs):
    y = op.expected(case, world, inputs)[0]["y"].to(torch.bfloat16)
    return [{"y": y.clone()} for _ in range(world)]


def test_matmul_verify_accepts_the_float32_sum_and_checks_bits_across_ranks():
    op = get_op("matmul_allreduce_decode")
    case = _mm([3, 512, 40])
    world = 3
    inputs = [op.make_inputs(case, r, world, 100 + r) for r in range(world)]
    outs = _outputs(op, case, world, inputs)
    assert op.verify(case, world, inputs, outs, TOL) is None
    # one element one bfloat16 ulp off on rank 2: within tolerance, but not the same bits as rank 0
    flat = outs[2]["y"].view(-1)
    flat[17] = torch.nextafter(flat[17].float(), torch.tensor(1e9)).to(torch.bfloat16)
    if torch.equal(outs[2]["y"], outs[0]["y"]):  # nextafter in float32 rounded back: step the bits instead
        flat.view(torch.int16)[17] += 1
    bad = op.verify(case, world, inputs, outs, TOL)
    assert bad is not None and bad["reason"] == "semantics" and bad["rank"] == 2 and bad["wrong_count"] == 1
    assert bad["index"] == [17 // 40, 17 % 40]


def test_matmul_partials_rounded_to_bf16_fail():
    """Partial products rounded to bfloat16 before the cross-rank sum miss the tolerance (the prompt says so)."""
    op = get_op("matmul_allreduce_decode")
    case = _mm([4, 4096, 256])
    world = 2
    inputs = [op.make_inputs(case, r, world, 7 + r) for r in range(world)]
    parts = [(i["x"].double() @ i["w"].double().T).to(torch.bfloat16).float() for i in inputs]
    y = sum(parts).to(torch.bfloat16)
    bad = op.verify(case, world, inputs, [{"y": y.clone()} for _ in range(world)], TOL)
    assert bad is not None and bad["reason"] == "value"


def test_matmul_missing_rank_fails():
    op = get_op("matmul_allreduce_decode")
    case = _mm([2, 64, 16])
    inputs = [op.make_inputs(case, r, 2, r) for r in range(2)]
    y = (inputs[0]["x"].double() @ inputs[0]["w"].double().T).to(torch.bfloat16)  # rank 1's part left out
    assert op.verify(case, 2, inputs, [{"y": y.clone()}, {"y": y.clone()}], TOL) is not None


@pytest.mark.parametrize("shape,dtype,params,msg", [
    ([65, 8, 8], "bfloat16", {"k": 8}, "M <= 64"),
    ([4, 8, 16385], "bfloat16", {"k": 8}, "N <= 16384"),
    ([4, 8, 8], "float32", {"k": 8}, "tensor-core"),
    ([4, 8, 8], "bfloat16", {"k": 9}, "params.k"),
    ([4, 8, 8], "bfloat16", {"k": 8, "bogus": 1}, "unknown params"),
])
def test_matmul_validate_case(shape, dtype, params, msg):
    with pytest.raises(ValueError, match=msg):
        get_op("matmul_allreduce_decode").validate_case(CaseSpec(name="c", shape=shape, dtype=dtype, params=params))


def test_matmul_benchmark_size_mapping():
    op = get_op("matmul_allreduce_decode")
    perf = PerformanceSpec(metric="latency", sizes=[64 << 20], dtype="bfloat16", params={"m": 16, "n": 8192})
    case = op.size_case(perf, 64 << 20, 4)
    assert case.shape == [16, 4096, 8192] and case.params == {"k": 4096}
    op.validate_case(case)
    assert op.metric_bytes(case, 4) == 64 << 20
    assert op.flops(case, 4) == 2.0 * 16 * 4096 * 8192


def test_matmul_card_loads():
    card = load_task("fusion/matmul_allreduce_decode").card
    assert card.semantics.op == "matmul_allreduce_decode" and card.performance.metric == "latency"
    for c in card.cases:
        assert c.params["k"] == c.shape[1]


# ---- vocab_embedding_allreduce ----------------------------------------------------------------------------------
def test_embedding_prompt_example():
    op = get_op("vocab_embedding_allreduce")
    case = _case([4, 3, 2], "float32")
    ids = torch.tensor([2, 0, -1, 2])
    inputs = [{"table_shard": torch.tensor([[1., 2.], [3., 4.]]), "ids": ids, "vocab_bounds": torch.tensor([0, 2, 3])},
              {"table_shard": torch.tensor([[5., 6.]]), "ids": ids, "vocab_bounds": torch.tensor([0, 2, 3])}]
    exp = op.expected(case, 2, inputs)
    want = [[5., 6.], [1., 2.], [0., 0.], [5., 6.]]
    assert exp[0]["out"].tolist() == want and exp[1]["out"].tolist() == want


def test_embedding_inputs_are_shared_ids_and_private_rows():
    op = get_op("vocab_embedding_allreduce")
    case = _case([300, 5000, 8], "bfloat16", shard_seed=3)
    world = 4
    inputs = [op.make_inputs(case, r, world, 50 + r) for r in range(world)]
    b = inputs[0]["vocab_bounds"].tolist()
    assert b[0] == 0 and b[-1] == 5000 and b == sorted(b) and len(b) == world + 1
    for r, i in enumerate(inputs):
        assert torch.equal(i["ids"], inputs[0]["ids"]) and torch.equal(i["vocab_bounds"], inputs[0]["vocab_bounds"])
        assert i["table_shard"].shape == (b[r + 1] - b[r], 8)
    ids = inputs[0]["ids"]
    assert ids.dtype == torch.int64 and int(ids.min()) >= 0 and int(ids.max()) < 5000
    # the ids are the same in every call (public case data), the rows are not
    again = op.make_inputs(case, 1, world, 999)
    assert torch.equal(again["ids"], ids) and not torch.equal(again["table_shard"], inputs[1]["table_shard"])


def test_embedding_expected_by_hand_with_padding_and_empty_shard():
    op = get_op("vocab_embedding_allreduce")
    case = _case([40, 30, 3], "float16", empty_shard=1, pad=0.4, ids_seed=2)
    world = 3
    inputs = [op.make_inputs(case, r, world, r) for r in range(world)]
    b = inputs[0]["vocab_bounds"].tolist()
    assert b[2] == b[1]  # rank 1 owns nothing
    ids = inputs[0]["ids"]
    assert bool((ids == -1).any()) and bool((ids >= 0).any())
    exp = op.expected(case, world, inputs)[2]["out"]
    for i, v in enumerate(ids.tolist()):
        if v < 0:
            assert exp[i].tolist() == [0.0, 0.0, 0.0]
        else:
            owner = max(r for r in range(world) if b[r] <= v and b[r + 1] > v)
            assert torch.equal(exp[i], inputs[owner]["table_shard"][v - b[owner]])


def test_embedding_only_shard_all_padding_and_tiny_vocab():
    op = get_op("vocab_embedding_allreduce")
    case = _case([100, 4000, 4], "bfloat16", only_shard=2)
    b = op.bounds(case, 4)
    ids = op.ids(case, 4)
    assert int(ids.min()) >= b[2] and int(ids.max()) < b[3]
    assert bool((op.ids(_case([64, 512, 96], "float16", pad=1.0), 2) == -1).all())
    tiny = _case([50, 3, 8], "bfloat16")
    inputs = [op.make_inputs(tiny, r, 8, r) for r in range(8)]
    assert sum(i["table_shard"].shape[0] for i in inputs) == 3
    assert op.expected(tiny, 8, inputs)[5]["out"].shape == (50, 8)


def test_embedding_samples_match_expected():
    op = get_op("vocab_embedding_allreduce")
    case = _case([64, 900, 33], "bfloat16", pad=0.2, zipf=1.1)
    world = 3
    inputs = [op.make_inputs(case, r, world, 7 * r + 1) for r in range(world)]
    exp = op.expected(case, world, inputs)
    asked = {}

    def pick(r, name, numel):
        asked[r] = torch.randint(0, numel, (97,), generator=torch.Generator().manual_seed(r))
        return asked[r]

    got = op.expected_samples(case, world, inputs, pick)
    for r in range(world):
        assert torch.equal(got[r]["out"], exp[r]["out"].reshape(-1)[asked[r]])


def test_embedding_benchmark_size_mapping():
    op = get_op("vocab_embedding_allreduce")
    perf = PerformanceSpec(metric="algbw", sizes=[64 << 20], dtype="bfloat16", params={"vocab": 16384, "dim": 4096})
    case = op.size_case(perf, 64 << 20, 2)
    assert case.shape == [8192, 16384, 4096]
    op.validate_case(case)
    assert op.metric_bytes(case, 2) == 64 << 20


def test_embedding_card_needs_exact_tolerance():
    card = load_task("fusion/vocab_embedding_allreduce").card
    op = get_op("vocab_embedding_allreduce")
    op.validate_card(card)
    loose = card.model_copy(update={"tolerance": {}})
    with pytest.raises(ValueError, match="rtol = 0"):
        op.validate_card(loose)
