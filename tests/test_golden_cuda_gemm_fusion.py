"""Golden ops of commbench_env/golden/cuda_gemm_fusion.py (allgather_gemm_tiles, gemm_reduce_scatter_tiles) and
the promises of their tasks' prompts: the prompts' examples, params.k, the benchmark's cases, the scratch and flag
sizes every case gets, and the tolerance rule of the reduce-scatter prompt."""

from __future__ import annotations

import math

import pytest
import torch

from commbench_env.cards import DEFAULT_TOLERANCE, CaseSpec, load_task
from commbench_env.golden import get_op
from commbench_env.golden.compare import compare_tensor

AG, RS = "fusion/allgather_gemm_tiles", "fusion/gemm_reduce_scatter"
MIB = 1 << 20
TILE = 128  # the references' tile height and width (their flags count tiles of this size)


def _case(shape, dtype="bfloat16", **params) -> CaseSpec:
    return CaseSpec(name="t", shape=list(shape), dtype=dtype, params=params)


def _tol(dtype: str) -> tuple[float, float]:
    t = DEFAULT_TOLERANCE[dtype]
    return t.rtol, t.atol


# ---- the prompts' examples ----------------------------------------------------------------------------------------

def test_allgather_gemm_prompt_example():
    op = get_op("allgather_gemm_tiles")
    case = _case([1, 2, 1], "float16", k=2)
    inputs = [{"x": torch.tensor([[1.0, 2.0]]), "w": torch.tensor([[1.0], [1.0]])},
              {"x": torch.tensor([[3.0, 4.0]]), "w": torch.tensor([[2.0], [0.0]])}]
    out = op.expected(case, 2, inputs)
    assert torch.equal(out[0]["y"], torch.tensor([[3.0], [7.0]], dtype=torch.float64))
    assert torch.equal(out[1]["y"], torch.tensor([[2.0], [6.0]], dtype=torch.float64))


def test_gemm_reduce_scatter_prompt_example():
    op = get_op("gemm_reduce_scatter_tiles")
    case = _case([1, 1, 2], "float16", k=1)
    inputs = [{"a": torch.tensor([[1.0], [2.0]]), "b": torch.tensor([[1.0, 0.0]])},
              {"a": torch.tensor([[3.0], [4.0]]), "b": torch.tensor([[0.0, 1.0]])}]
    out = op.expected(case, 2, inputs)
    assert torch.equal(out[0]["y"], torch.tensor([[1.0, 3.0]], dtype=torch.float64))
    assert torch.equal(out[1]["y"], torch.tensor([[2.0, 4.0]], dtype=torch.float64))


@pytest.mark.parametrize("world", [2, 3])
def test_both_match_plain_products(world):
    ag, rs = get_op("allgather_gemm_tiles"), get_op("gemm_reduce_scatter_tiles")
    m, k, n = 3, 5, 4
    case = _case([m, k, n], k=k)
    xi = [ag.make_inputs(case, r, world, 7 + r) for r in range(world)]
    assert all(list(i["x"].shape) == [m, k] and list(i["w"].shape) == [k, n] for i in xi)
    got = ag.expected(case, world, xi)
    for r in range(world):
        for s in range(world):
            for i in range(m):
                for j in range(n):
                    want = sum(float(xi[s]["x"][i, t]) * float(xi[r]["w"][t, j]) for t in range(k))
                    assert abs(float(got[r]["y"][s * m + i, j]) - want) < 1e-9
    ri = [rs.make_inputs(case, r, world, 3 + r) for r in range(world)]
    assert all(list(i["a"].shape) == [world * m, k] and list(i["b"].shape) == [k, n] for i in ri)
    got = rs.expected(case, world, ri)
    for r in range(world):
        for i in range(m):
            for j in range(n):
                want = sum(float(ri[q]["a"][r * m + i, t]) * float(ri[q]["b"][t, j])
                           for q in range(world) for t in range(k))
                assert abs(float(got[r]["y"][i, j]) - want) < 1e-9


# ---- cases: params.k, dtypes, limits --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["allgather_gemm_tiles", "gemm_reduce_scatter_tiles"])
@pytest.mark.parametrize("shape,dtype,params,match", [
    ([4, 8, 4], "bfloat16", {}, "params.k"),
    ([4, 8, 4], "bfloat16", {"k": 4}, "must equal shape"),
    ([4, 8, 4], "float32", {"k": 8}, "dtype"),
    ([4, 8, 4], "bfloat16", {"k": 8, "n": 4}, "unknown params"),
    ([4, 70000, 4], "bfloat16", {"k": 70000}, "<= 65536"),
])
def test_cases_are_validated(name, shape, dtype, params, match):
    with pytest.raises(ValueError, match=match):
        get_op(name).validate_case(_case(shape, dtype, **params))


@pytest.mark.parametrize("task", [AG, RS])
@pytest.mark.parametrize("world", [2, 4, 8])
def test_benchmark_cases_carry_k(task, world):
    card = load_task(task).card
    op = get_op(card.semantics.op)
    perf = card.performance
    for size in perf.sizes_for("cuda"):
        case = op.size_case(perf, size, world)
        m, k, n = case.shape
        assert case.params == {"k": k} and k == perf.params["k"] and n == perf.params["n"]
        assert op.metric_bytes(case, world) == size  # the sizes divide evenly: the metric is the stated one
        assert op.flops(case, world) == 2.0 * world * m * k * n


def _sizes(task: str, world: int):
    """(case, m, k, n, input bytes) of every check case and every benchmark size of a task at a world size."""
    card = load_task(task).card
    op = get_op(card.semantics.op)
    cases = list(card.cases) + [op.size_case(card.performance, s, world) for s in card.performance.sizes_for("cuda")]
    for case in cases:
        m, k, n = (int(s) for s in case.shape)
        rows = m if task == AG else world * m
        yield case, m, k, n, rows * k * 2


@pytest.mark.parametrize("world", [2, 4, 8])
def test_scratch_and_flags_meet_the_prompts(world):
    """What the prompts promise (and the references need) fits what the judge hands every case."""
    for task in (AG, RS):
        cuda = load_task(task).card.cuda
        for case, m, k, n, in_bytes in _sizes(task, world):
            scratch = max(cuda.scratch_bytes, int(cuda.scratch_per_input * in_bytes), 256)
            if task == AG:
                promised = max(world * in_bytes + MIB, 16 * MIB)
                ref_scratch = world * (math.ceil(in_bytes / 256) * 256)
                ref_flags = world * math.ceil(m / TILE)
            else:
                promised = max(4 * world * m * n + MIB, 64 * MIB)
                ref_scratch = world * (math.ceil(m * math.ceil(n / 4) * 4 * 4 / 256) * 256)
                ref_flags = world * math.ceil(m / TILE) * math.ceil(n / TILE)
            assert scratch >= promised >= ref_scratch, (task, case.name, world)
            assert cuda.flag_words == 65536 >= ref_flags, (task, case.name, world)


# ---- the tolerance rule of the reduce-scatter prompt ----------------------------------------------------------------

def test_partials_rounded_to_16_bits_fail_and_float32_sums_pass():
    """The prompt says: sums kept in float32 pass, partials rounded to the data type before the cross-rank sum do
    not. Checked on the deep-k hidden case at world 2."""
    card = load_task(RS).card
    op = get_op(card.semantics.op)
    case = next(c for c in card.cases if c.name == "deep-k-bf16")
    world, m = 2, int(case.shape[0])
    inputs = [op.make_inputs(case, r, world, 100 + r) for r in range(world)]
    exp = op.expected(case, world, inputs)
    parts = [i["a"].float() @ i["b"].float() for i in inputs]  # float32 products of the bf16 inputs
    tol = _tol(case.dtype)
    for r in range(world):
        rows = slice(r * m, (r + 1) * m)
        exact = sum(p[rows] for p in parts).to(torch.bfloat16)
        assert compare_tensor(exp[r]["y"], exact, tol) is None
        rounded = sum(p[rows].to(torch.bfloat16).float() for p in parts).to(torch.bfloat16)
        bad = compare_tensor(exp[r]["y"], rounded, tol)
        assert bad is not None and bad["wrong_count"] > 10


def test_allgather_gemm_own_rows_only_fail():
    """A rank that multiplies only what it holds cannot pass: the other ranks' rows are needed."""
    card = load_task(AG).card
    op = get_op(card.semantics.op)
    case = next(c for c in card.cases if c.name == "small-bf16")
    world, m = 2, int(case.shape[0])
    inputs = [op.make_inputs(case, r, world, 5 + r) for r in range(world)]
    exp = op.expected(case, world, inputs)
    tol = _tol(case.dtype)
    for r in range(world):
        y = (torch.cat([inputs[s]["x"].float() for s in range(world)]) @ inputs[r]["w"].float()).to(torch.bfloat16)
        assert compare_tensor(exp[r]["y"], y, tol) is None
        guess = (torch.cat([inputs[r]["x"].float()] * world) @ inputs[r]["w"].float()).to(torch.bfloat16)
        assert compare_tensor(exp[r]["y"], guess, tol) is not None
        assert m >= 1
