"""Golden ops of commbench_env/golden/cuda_ep_routing.py (router_topk_layout, moe_dispatch_fp8): expected outputs
against hand-made examples and plain loops written from the prompts' definitions, and the fp8 bound's verdicts."""

from __future__ import annotations

import math

import pytest
import torch

from commbench_env.cards import CaseSpec, PerformanceSpec, load_task
from commbench_env.golden import get_op
from commbench_env.golden.cuda_ep_routing import fp8_blocks, fp8_decode, fp8_quantise


def _case(shape, dtype="float32", **params) -> CaseSpec:
    return CaseSpec(name="t", shape=list(shape), dtype=dtype, params=params)


# ---- router_topk_layout ------------------------------------------------------------------------------------------

def test_router_prompt_example():
    op = get_op("router_topk_layout")
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    for norm, w0 in ((1, 0.5), (0, 1 / (math.exp(-2) + 2 + math.exp(-3)))):
        case = _case([2], experts_per_rank=2, topk=2, normalize=norm)
        out = op.expected(case, 2, [{"logits": logits}] * 2)[0]
        assert out["topk_idx"].tolist() == [[1, 2], [0, 1]]
        assert torch.allclose(out["topk_weights"][0], torch.tensor([w0, w0], dtype=torch.float64))
        assert torch.allclose(out["topk_weights"][1], torch.tensor([0.5, 0.5] if norm else [0.25, 0.25],
                                                                   dtype=torch.float64))
        assert out["is_token_in_rank"].tolist() == [[True, True], [True, False]]
        assert out["tokens_per_rank"].tolist() == [2, 1]
        assert out["tokens_per_expert"].tolist() == [1, 2, 1, 0]


def _router_loops(logits: torch.Tensor, k: int, epr: int, world: int, norm: bool):
    """The prompt's definitions, one token at a time."""
    t, n_exp = logits.shape
    idx, w = [], []
    per_rank, per_expert = [0] * world, [0] * n_exp
    hits = []
    for i in range(t):
        row = [float(v) for v in logits[i].to(torch.float64)]
        order = sorted(range(n_exp), key=lambda e: (-row[e], e))[:k]
        m = max(row)
        p = [math.exp(row[e] - m) for e in order]
        denom = sum(p) if norm else sum(math.exp(v - m) for v in row)
        idx.append(order)
        w.append([x / denom for x in p])
        h = [any(e // epr == r for e in order) for r in range(world)]
        hits.append(h)
        for r in range(world):
            per_rank[r] += h[r]
        for e in order:
            per_expert[e] += 1
    return idx, w, hits, per_rank, per_expert


@pytest.mark.parametrize("dtype,world,params", [
    ("bfloat16", 4, dict(experts_per_rank=8, topk=4, normalize=1, grid=0.25, tie_rows=0.3)),
    ("float32", 2, dict(experts_per_rank=16, topk=6, normalize=0, scale=3.0, skew=0.5)),
    ("float16", 8, dict(experts_per_rank=5, topk=3, normalize=0, scale=40.0)),
    ("float16", 2, dict(experts_per_rank=1, topk=2, normalize=1, grid=1.0)),
    ("bfloat16", 2, dict(experts_per_rank=3, topk=1, normalize=1, idle_rank=1, skew=2.0)),
])
def test_router_matches_plain_loops(dtype, world, params):
    op = get_op("router_topk_layout")
    case = _case([57], dtype, **params)
    op.validate_case(case)
    inputs = [op.make_inputs(case, r, world, 11 + r) for r in range(world)]
    out = op.expected(case, world, inputs)
    for r in range(world):
        x = inputs[r]["logits"]
        assert x.dtype == getattr(torch, dtype) and x.shape == (57, world * params["experts_per_rank"])
        assert not bool((x == 0).logical_and(torch.signbit(x)).any())  # no negative zeros
        idx, w, hits, per_rank, per_expert = _router_loops(x, params["topk"], params["experts_per_rank"], world,
                                                           params["normalize"] == 1)
        assert out[r]["topk_idx"].tolist() == idx
        assert torch.allclose(out[r]["topk_weights"], torch.tensor(w, dtype=torch.float64), rtol=1e-12, atol=0)
        assert out[r]["is_token_in_rank"].tolist() == hits
        assert out[r]["tokens_per_rank"].tolist() == per_rank
        assert out[r]["tokens_per_expert"].tolist() == per_expert
        assert out[r]["tokens_per_rank"].dtype == torch.int32 and out[r]["topk_idx"].dtype == torch.int64


def test_router_inputs_have_ties_and_idle_ranks():
    op = get_op("router_topk_layout")
    case = _case([400], "bfloat16", experts_per_rank=24, topk=5, normalize=0, tie_rows=1.0)
    x = op.make_inputs(case, 0, 2, 3)["logits"]
    assert bool((x == x[:, :1]).all())  # every row constant: experts 0 .. k-1 win
    assert op.expected(case, 2, [{"logits": x}] * 2)[0]["topk_idx"].tolist() == [list(range(5))] * 400
    case = _case([300], "bfloat16", experts_per_rank=16, topk=8, normalize=1, idle_rank=1)
    out = op.expected(case, 4, [op.make_inputs(case, r, 4, r) for r in range(4)])
    assert all(int(o["tokens_per_rank"][1]) == 0 for o in out)


def test_router_benchmark_size_and_card():
    op = get_op("router_topk_layout")
    task = load_task("ep/router_topk_layout")
    perf = task.card.performance
    for world in (2, 4, 8):
        case = op.size_case(perf, 16 << 20, world)
        assert case.params["experts_per_rank"] * world == 256 and op.metric_bytes(case, world) == 16 << 20
        op.validate_case(case)
    assert any(not c.visible and c.params.get("normalize") == 0 for c in task.card.cases)


# ---- moe_dispatch_fp8 ----------------------------------------------------------------------------------------------

def test_fp8_quantise_rule():
    x = torch.zeros(2, 130)
    x[0, 0], x[0, 1], x[0, 129] = 3.5, 1.0, -0.5
    codes, scales = fp8_quantise(x)
    assert scales.shape == (2, 2) and fp8_blocks(130) == 2
    assert float(scales[0, 0]) == 3.5 / 448 and int(codes[0, 1]) == 0x70 and int(codes[0, 0]) == 0x7E
    floor = torch.tensor(1e-4, dtype=torch.float32)
    assert scales[1, 0].view(torch.int32) == (floor / 448).view(torch.int32)  # all-zero block: the clamp
    assert float(scales[0, 1]) == torch.tensor(0.5 / 448, dtype=torch.float32).item()
    assert int(codes[0, 129]) == 0xFE  # -448
    assert bool((fp8_decode(codes[1]) == 0).all())


def _fp8_setup(world=2, **params):
    op = get_op("moe_dispatch_fp8")
    case = _case([40, 200], "bfloat16", experts_per_rank=2, topk=2, **params)
    op.validate_case(case)
    inputs = [op.make_inputs(case, r, world, 5 + r) for r in range(world)]
    return op, case, inputs


def test_fp8_expected_follows_dispatch_order():
    op, case, inputs = _fp8_setup(world=2)
    exp = op.expected(case, 2, inputs)
    plain = get_op("moe_dispatch_tokens").expected(case.model_copy(update={"params": {"experts_per_rank": 2,
                                                                                     "topk": 2}}), 2, inputs)
    for e, p in zip(exp, plain):
        for name in ("recv_src_idx", "recv_topk_idx", "recv_counts"):
            assert torch.equal(e[name], p[name])
        n = int(p["recv_counts"].sum())
        codes, scales = fp8_quantise(p["recv_x"][:n])
        assert torch.equal(e["recv_x"][:n], codes) and bool((e["recv_x"][n:] == 0).all())
        assert torch.equal(e["recv_scales"][:n].view(torch.float32), scales)
        assert bool((e["recv_scales"][n:] == 0).all()) and e["recv_scales"].dtype == torch.int32


def test_fp8_verify_accepts_golden_and_other_rounding():
    op, case, inputs = _fp8_setup(world=2, spread=3.0, zero_blocks=0.2)
    exp = op.expected(case, 2, inputs)
    assert op.verify(case, 2, inputs, exp, (0.0, 0.0)) is None
    # x * (448 / amax) instead of x / scale: other codes now and then, all within the bound
    alt, changed = [], 0
    for r, e in enumerate(exp):
        got = {k: v.clone() for k, v in e.items()}
        n = int(e["recv_counts"].sum())
        rows = torch.cat([inputs[src]["x"][idx] for src, idx, _ in op._received(case, 2, inputs)[r]]).float()
        amax = torch.maximum(rows.view(n, -1).abs(), torch.zeros(())).new_zeros(n, 2)
        for b in range(2):
            amax[:, b] = rows[:, b * 128:(b + 1) * 128].abs().amax(1).clamp_min(1e-4)
        inv = (448.0 / amax).repeat_interleave(128, dim=1)[:, :200]
        got["recv_x"][:n] = (rows * inv).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        changed += int((got["recv_x"] != e["recv_x"]).sum())
        alt.append(got)
    assert changed > 0 and op.verify(case, 2, inputs, alt, (0.0, 0.0)) is None


def _corrupt(op, case, inputs, fn):
    exp = op.expected(case, 2, inputs)
    got = [{k: v.clone() for k, v in e.items()} for e in exp]
    fn(got[1], int(exp[1]["recv_counts"].sum()))
    return op.verify(case, 2, inputs, got, (0.0, 0.0))


def test_fp8_verify_catches_wrong_codes_scales_and_tails():
    op, case, inputs = _fp8_setup(world=2, spread=2.0)

    def truncate(g, n):  # round toward zero instead of to nearest
        codes = g["recv_x"][:n]
        rows = torch.cat([inputs[src]["x"][idx] for src, idx, _ in op._received(case, 2, inputs)[1]]).double()
        s = g["recv_scales"][:n].view(torch.float32).double().repeat_interleave(128, dim=1)[:, :200]
        up = (fp8_decode(codes).abs() > (rows / s).abs()).logical_and((codes & 0x7F) > 0)
        codes[up] -= 1

    m = _corrupt(op, case, inputs, truncate)
    assert m and m["output"] == "recv_x" and m["reason"] == "value" and "allowed" in m["detail"]
    m = _corrupt(op, case, inputs, lambda g, n: g["recv_x"][:n].__setitem__((0, 3), 0x7F))
    assert m and m["reason"] == "nan"
    m = _corrupt(op, case, inputs, lambda g, n: g["recv_scales"].__setitem__((0, 1), g["recv_scales"][0, 1] + 1))
    assert m and m["output"] == "recv_scales" and m["index"] == [0, 1]
    m = _corrupt(op, case, inputs, lambda g, n: g["recv_x"].__setitem__((n, 0), 0xFF))
    assert m and m["output"] == "recv_x" and m["index"] == [n_of(op, case, inputs), 0]
    m = _corrupt(op, case, inputs, lambda g, n: g["recv_src_idx"].__setitem__(0, 99))
    assert m and m["output"] == "recv_src_idx"

    def token_scale(g, n):  # one scale for the whole token: small blocks lose their low bits
        s = g["recv_scales"][:n].view(torch.float32)
        rows = torch.cat([inputs[src]["x"][idx] for src, idx, _ in op._received(case, 2, inputs)[1]]).float()
        top = s.max(1, keepdim=True).values.expand_as(s).contiguous()
        g["recv_x"][:n] = (rows / top.repeat_interleave(128, dim=1)[:, :200]).clamp(-448, 448).to(
            torch.float8_e4m3fn).view(torch.uint8)
        g["recv_scales"][:n] = top.view(torch.int32)

    m = _corrupt(op, case, inputs, token_scale)
    assert m and m["output"] == "recv_scales"  # the exact scale rule catches it first


def n_of(op, case, inputs) -> int:
    return int(op.expected(case, 2, inputs)[1]["recv_counts"].sum())


def test_fp8_bound_rejects_a_per_token_scale_even_with_its_own_scales():
    """The bound alone (scales aside) fails codes quantised with one scale per token, where blocks differ."""
    op, case, inputs = _fp8_setup(world=2, spread=3.0)
    x = inputs[0]["x"][:8].to(torch.float64)
    codes, scales = fp8_quantise(inputs[0]["x"][:8])
    top = scales.max(1, keepdim=True).values
    coarse = (inputs[0]["x"][:8].float() / top).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    s = scales.double().repeat_interleave(128, dim=1)[:, :200]
    assert bool(((fp8_decode(codes) * s - x).abs() <= x.abs() / 16 + s / 1000).all())
    assert not bool(((fp8_decode(coarse) * s - x).abs() <= x.abs() / 16 + s / 1000).all())


def test_fp8_grid_inputs_make_every_code_exact():
    op = get_op("moe_dispatch_fp8")
    perf = PerformanceSpec(metric="algbw", sizes=[1], dtype="bfloat16",
                           params={"hidden": 7168, "experts_per_rank": 32, "topk": 8, "skew": 0.0})
    case = op.size_case(perf, 1 << 20, 2)
    assert case.params["grid"] is True and case.shape == [73, 7168]
    x = op.make_inputs(case, 0, 2, 1)["x"]
    codes, scales = fp8_quantise(x)
    p = torch.log2(scales.double())
    assert bool((p == p.round()).all())  # powers of two: x / scale and x * (1 / scale) agree
    assert torch.equal(fp8_decode(codes) * scales.double().repeat_interleave(128, dim=1), x.to(torch.float64))


def test_fp8_scratch_guarantee_holds():
    """The prompt promises 4 * world * T * (k + nb + 2) bytes + 1 MiB of scratch, and at least 8 MiB."""
    task = load_task("ep/fp8_dispatch")
    op = get_op("moe_dispatch_fp8")
    cuda = task.card.cuda
    cases = list(task.card.cases) + [op.size_case(task.card.performance, s, w)
                                     for s in task.card.performance.gpu_sizes for w in (2, 4, 8)]
    for case in cases:
        t, d = case.shape
        x_bytes = t * d * torch.empty((), dtype=getattr(torch, case.dtype)).element_size()
        have = max(cuda.scratch_bytes, int(cuda.scratch_per_input * x_bytes))
        for world in task.card.world.sizes:
            need = 4 * world * t * (case.params["topk"] + fp8_blocks(d) + 2) + (1 << 20)
            assert have >= need and have >= 8 << 20, (case.name, world)
