"""Golden ops of the kernel-level expert-parallel tasks (moe_dispatch_layout, moe_dispatch_tokens, moe_combine_topk):
their expected outputs against plain-loop computations written from the definitions, and the routing they draw."""

from __future__ import annotations

import pytest
import torch

from commbench_env.cards import CaseSpec, Language, PerformanceSpec, load_task
from commbench_env.golden import get_op

WORLDS = (2, 4)
SEEDS = (3, 20240601)


def _case(shape, dtype="float32", **params) -> CaseSpec:
    params.setdefault("experts_per_rank", 3)
    params.setdefault("topk", 4)
    return CaseSpec(name="t", shape=list(shape), dtype=dtype, params=params)


def _inputs(op, case, world: int, seed: int) -> list[dict]:
    return [op.make_inputs(case, r, world, seed * 7919 + r) for r in range(world)]


def _entries(ids: torch.Tensor) -> list[list[int]]:
    return [[int(e) for e in row] for row in ids]


# ---- routing -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("params", [
    {}, {"drop": 0.5}, {"skew": 3.0}, {"target_rank": 1}, {"idle_rank": 0, "topk": 8, "experts_per_rank": 2},
])
def test_routing_rows_hold_distinct_valid_experts(params):
    op = get_op("moe_dispatch_layout")
    case = _case([300], "int64", **params)
    for world in (2, 4, 8):
        ids = op.make_inputs(case, 1, world, 5)["topk_idx"]
        assert ids.dtype == torch.int64 and list(ids.shape) == [300, case.params["topk"]]
        n_exp = world * case.params["experts_per_rank"]
        for row in _entries(ids):
            valid = [e for e in row if e >= 0]
            assert all(e == -1 or 0 <= e < n_exp for e in row)
            assert len(valid) == len(set(valid)), row
            if "target_rank" in params:
                assert all(e // case.params["experts_per_rank"] == 1 % world for e in valid)
            if "idle_rank" in params:
                assert all(e // case.params["experts_per_rank"] != 0 for e in valid)


def test_routing_pads_with_minus_one_when_too_few_experts_are_eligible():
    op = get_op("moe_dispatch_layout")
    case = _case([50], "int64", experts_per_rank=2, topk=6, target_rank=0)
    ids = op.make_inputs(case, 0, 4, 1)["topk_idx"]
    assert bool((ids[:, :2] >= 0).all()) and bool((ids[:, 2:] == -1).all())
    assert set(ids[:, :2].flatten().tolist()) == {0, 1}


def test_routing_drop_all_routes_nowhere_and_seeds_matter():
    op = get_op("moe_dispatch_layout")
    assert bool((op.make_inputs(_case([40], "int64", drop=1.0), 0, 2, 9)["topk_idx"] == -1).all())
    case = _case([200], "int64")
    a, b = op.make_inputs(case, 0, 4, 11)["topk_idx"], op.make_inputs(case, 0, 4, 11)["topk_idx"]
    assert torch.equal(a, b)
    assert not torch.equal(a, op.make_inputs(case, 0, 4, 12)["topk_idx"])


def test_large_routing_stays_distinct():
    """The benchmark path (redraws, then exact draws for leftover rows) with skew and many experts per token."""
    op = get_op("moe_dispatch_layout")
    ids = op.make_inputs(_case([20000], "int64", experts_per_rank=4, topk=8, skew=2.0), 0, 2, 4)["topk_idx"]
    srt = ids.sort(1).values
    assert bool((ids >= 0).all()) and bool((srt[:, 1:] != srt[:, :-1]).all())


# ---- dispatch layout -----------------------------------------------------------------------------------------------

def _layout_by_loops(ids: torch.Tensor, epr: int, world: int) -> dict[str, list]:
    rows = _entries(ids)
    in_rank = [[any(e >= 0 and e // epr == r for e in row) for r in range(world)] for row in rows]
    per_expert = [0] * (world * epr)
    for row in rows:
        for e in row:
            if e >= 0:
                per_expert[e] += 1
    sent = [0] * world
    slots = []
    for hits in in_rank:
        slots.append([sent[r] if hits[r] else -1 for r in range(world)])
        for r in range(world):
            sent[r] += hits[r]
    return {"is_token_in_rank": in_rank, "tokens_per_rank": sent, "tokens_per_expert": per_expert, "send_slot": slots}


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("params", [{}, {"drop": 0.4, "topk": 3}, {"topk": 1, "skew": 2.0}, {"target_rank": 3}])
def test_dispatch_layout_matches_loops(world, seed, params):
    op = get_op("moe_dispatch_layout")
    case = _case([157], "int64", **params)
    inputs = _inputs(op, case, world, seed)
    for inp, exp in zip(inputs, op.expected(case, world, inputs)):
        want = _layout_by_loops(inp["topk_idx"], case.params["experts_per_rank"], world)
        assert exp["is_token_in_rank"].dtype == torch.bool
        assert all(exp[k].dtype == torch.int32 for k in ("tokens_per_rank", "tokens_per_expert", "send_slot"))
        for name, value in want.items():
            assert exp[name].tolist() == value, name


# ---- dispatch ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("params,dtype", [({}, "float32"), ({"drop": 0.5}, "bfloat16"), ({"target_rank": 0}, "float32"),
                                          ({"topk": 1, "experts_per_rank": 1}, "bfloat16")])
def test_dispatch_matches_loops(world, seed, params, dtype):
    op = get_op("moe_dispatch_tokens")
    case = _case([37, 5], dtype, **params)
    epr, k = case.params["experts_per_rank"], case.params["topk"]
    inputs = _inputs(op, case, world, seed)
    expected = op.expected(case, world, inputs)
    cap = world * 37
    for r, exp in enumerate(expected):
        rows, src, local, counts, per_expert = [], [], [], [0] * world, [0] * epr
        for s, inp in enumerate(inputs):
            for i, row in enumerate(_entries(inp["topk_idx"])):
                mine = [e >= 0 and e // epr == r for e in row]
                if any(mine):
                    rows.append(inp["x"][i].tolist())
                    src.append(i)
                    local.append([e - r * epr if m else -1 for e, m in zip(row, mine)])
                    counts[s] += 1
                    for e, m in zip(row, mine):
                        if m:
                            per_expert[e - r * epr] += 1
        n = len(rows)
        assert exp["recv_x"].shape == (cap, 5) and exp["recv_x"].dtype == inputs[0]["x"].dtype
        assert exp["recv_x"][:n].tolist() == rows and bool((exp["recv_x"][n:] == 0).all())
        assert exp["recv_src_idx"].tolist() == src + [-1] * (cap - n)
        assert exp["recv_topk_idx"].tolist() == local + [[-1] * k] * (cap - n)
        assert exp["recv_counts"].tolist() == counts
        assert exp["recv_tokens_per_expert"].tolist() == per_expert


def test_dispatch_output_shapes_do_not_depend_on_the_seed():
    """The benchmark sizes outputs once per size: every iteration's outputs must have the same shapes."""
    op = get_op("moe_dispatch_tokens")
    case = _case([64, 16], "bfloat16", skew=2.0)
    shapes = {tuple((k, tuple(v.shape)) for k, v in sorted(e.items()))
              for seed in range(4) for e in op.expected(case, 4, _inputs(op, case, 4, seed))}
    assert len(shapes) == 1  # every rank, every seed


# ---- combine -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("params", [{}, {"drop": 0.5}, {"target_rank": 1}, {"topk": 1, "skew": 2.0}])
def test_combine_matches_loops(world, seed, params):
    op = get_op("moe_combine_topk")
    case = _case([29, 6], "float32", **params)
    epr = case.params["experts_per_rank"]
    inputs = _inputs(op, case, world, seed)
    # every expert's rows in the order (source rank, token, slot), from the definition
    where: dict[tuple[int, int, int], tuple[int, int]] = {}
    filled = [0] * world
    for s, inp in enumerate(inputs):
        for i, row in enumerate(_entries(inp["topk_idx"])):
            for j, e in enumerate(row):
                if e >= 0:
                    where[(s, i, j)] = (e // epr, filled[e // epr])
                    filled[e // epr] += 1
    for r, inp in enumerate(inputs):
        assert int(inp["expert_out"].shape[0]) == filled[r]
        assert torch.equal(inp["rank_offsets"], inputs[0]["rank_offsets"])
        assert torch.equal(inp["topk_idx"], op.routing(case, world)[r])
    for s, (inp, exp) in enumerate(zip(inputs, op.expected(case, world, inputs))):
        for i in range(29):
            want = [0.0] * 6
            for j in range(case.params["topk"]):
                if (s, i, j) in where:
                    r, row = where[(s, i, j)]
                    w = float(inp["topk_weights"][i, j])
                    want = [a + w * float(v) for a, v in zip(want, inputs[r]["expert_out"][row])]
            assert exp["combined_x"][i].tolist() == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_combine_routing_is_shared_but_values_are_private():
    op = get_op("moe_combine_topk")
    case = _case([16, 4], "float32")
    a, b = op.make_inputs(case, 0, 2, 1), op.make_inputs(case, 0, 2, 2)
    assert torch.equal(a["topk_idx"], b["topk_idx"]) and torch.equal(a["rank_offsets"], b["rank_offsets"])
    assert not torch.equal(a["topk_weights"], b["topk_weights"])
    other = _case([16, 4], "float32", routing_seed=1)
    assert not torch.equal(a["topk_idx"], op.make_inputs(other, 0, 2, 1)["topk_idx"])


# ---- cards, benchmark sizes, validation ----------------------------------------------------------------------------

@pytest.mark.parametrize("task", ["ep/dispatch_layout_cuda", "ep/dispatch_cuda", "ep/combine_cuda"])
def test_benchmark_cases_match_their_metric_bytes(task):
    t = load_task(task)
    op = get_op(t.card.semantics.op)
    perf = t.card.performance
    for size in perf.gpu_sizes:
        case = op.size_case(perf, size, 8)
        op.validate_case(case)
        assert size * 0.99 <= op.metric_bytes(case, 8) <= size


@pytest.mark.parametrize("params,message", [
    ({"topk": 2}, "experts_per_rank"),
    ({"experts_per_rank": 2}, "topk"),
    ({"experts_per_rank": 2, "topk": 33}, "topk"),
    ({"experts_per_rank": 129, "topk": 2}, "experts_per_rank"),
    ({"experts_per_rank": 2, "topk": 2, "drop": 1.5}, "drop"),
    ({"experts_per_rank": 2, "topk": 2, "colour": 1}, "unknown params"),
])
def test_validation_names_the_bad_param(params, message):
    for name, shape, dtype in (("moe_dispatch_layout", [8], "int64"), ("moe_dispatch_tokens", [8, 4], "float32"),
                               ("moe_combine_topk", [8, 4], "bfloat16")):
        with pytest.raises(ValueError, match=message):
            get_op(name).validate_case(CaseSpec(name="x", shape=shape, dtype=dtype, params=params))


def test_ops_serve_cuda_cards_only():
    card = load_task("ep/dispatch_cuda").card.model_copy(update={"language": Language.torch, "cuda": None})
    with pytest.raises(ValueError, match="language"):
        get_op("moe_dispatch_tokens").validate_card(card)
    case = CaseSpec(name="x", shape=[8, 4], dtype="float32", params={"experts_per_rank": 1, "topk": 1})
    for name, bad in (("moe_dispatch_layout", "float32"), ("moe_dispatch_tokens", "int64")):
        with pytest.raises(ValueError, match="dtype"):
            get_op(name).validate_case(case.model_copy(update={"dtype": bad, "shape": [8] if bad == "float32" else [8, 4]}))


def test_perf_params_default_to_a_deepseek_like_layer():
    op = get_op("moe_dispatch_tokens")
    case = op.size_case(PerformanceSpec(metric="algbw", sizes=[1 << 20], dtype="bfloat16"), 1 << 24, 8)
    assert case.shape == [(1 << 24) // (7168 * 2), 7168]
    assert case.params == {"experts_per_rank": 32, "topk": 8}
