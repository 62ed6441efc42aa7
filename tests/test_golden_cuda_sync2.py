"""The golden ops of utility/grid_barrier_epoch (a tridiagonal power iteration) and utility/cross_rank_scan (an
exclusive prefix sum over the ranks' data in rank order), checked on the CPU against hand-made examples."""

from __future__ import annotations

import pytest
import torch

from commbench_env.cards import CaseSpec, load_task
from commbench_env.golden import get_op

POWER = "tridiag_power_iteration"
SCAN = "rank_major_exclusive_scan"


def _t(*v, dtype=torch.float64):
    return torch.tensor(v, dtype=dtype)


# ---- power iteration -------------------------------------------------------------------------------------------
def test_power_iteration_prompt_example():
    op = get_op(POWER)
    case = CaseSpec(name="ex", shape=[2], dtype="float64", params={"rounds": 1})
    inputs = [{"x": _t(1, 2), "lower": _t(9, 1), "diag": _t(2, 1), "upper": _t(1, 9)}]
    (out,) = op.expected(case, 1, inputs)
    assert out["y"].tolist() == [1.0, 0.75]


def test_power_iteration_two_rounds_and_negative_maximum():
    op = get_op(POWER)
    # round 1: w = [-2*2 + 0*1, 1*2 + 1*1 + 0*0, 1*1 + 1*0] = [-4, 3, 1], m = 4 (from a negative w): y = [-1, .75, .25]
    # round 2: w = [-2*-1 + 0*.75, 1*-1 + .75 + 0*.25, .75 + .25] = [2, -.25, 1], m = 2
    inputs = [{"x": _t(2, 1, 0), "lower": _t(5, 1, 1), "diag": _t(-2, 1, 1), "upper": _t(0, 0, 5)}]
    case = CaseSpec(name="ex", shape=[3], dtype="float64", params={"rounds": 2})
    (out,) = op.expected(case, 1, inputs)
    assert torch.allclose(out["y"], _t(1.0, -0.125, 0.5))


def test_power_iteration_single_element_is_a_sign():
    op = get_op(POWER)
    inputs = [{"x": _t(0.5), "lower": _t(7), "diag": _t(-3), "upper": _t(7)}]
    for rounds, want in ((1, -1.0), (2, 1.0), (3, -1.0)):
        case = CaseSpec(name="one", shape=[1], dtype="float64", params={"rounds": rounds})
        assert op.expected(case, 1, inputs)[0]["y"].tolist() == [want]


def test_power_iteration_inputs_and_ignored_entries():
    op = get_op(POWER)
    case = CaseSpec(name="c", shape=[1000], dtype="float32", params={"rounds": 64})
    a = op.make_inputs(case, 0, 2, 11)
    assert op.make_inputs(case, 0, 2, 11)["x"].equal(a["x"])  # deterministic per seed
    assert all(a[k].dtype == torch.float32 and a[k].shape == (1000,) for k in ("x", "lower", "diag", "upper"))
    assert a["lower"][0] != 0 and a["upper"][-1] != 0  # present, and must not contribute
    y = op.expected(case, 2, [a])[0]["y"]
    assert y.abs().max() == 1.0 and y.min() > 1e-3  # every component stays well above atol after 64 rounds
    # a wrap-around (periodic) matrix gives a different answer
    lo, di, up = (a[k].double() for k in ("lower", "diag", "upper"))
    yy = a["x"].double()
    for _ in range(64):
        w = di * yy + lo * torch.roll(yy, 1) + up * torch.roll(yy, -1)
        yy = w / w.abs().max()
    assert (yy - y).abs().max() > 1e-2


def test_power_iteration_float32_emulation_within_tolerance():
    """A float32 candidate (FMA order, 1/m) stays within the card's float32 tolerance over many rounds."""
    op = get_op(POWER)
    tol = load_task("utility/grid_barrier_epoch").card.tolerance["float32"]
    for shape, params in (([2048], {"rounds": 2000, "spread": 0.05}), ([4099], {"rounds": 40, "signed": True})):
        case = CaseSpec(name="c", shape=shape, dtype="float32", params=params)
        i = op.make_inputs(case, 0, 1, 5)
        want = op.expected(case, 1, [i])[0]["y"]
        y = i["x"].clone()
        for _ in range(params["rounds"]):
            w = i["diag"] * y
            w[1:] += i["lower"][1:] * y[:-1]
            w[:-1] += i["upper"][:-1] * y[1:]
            y = w * (1 / w.abs().max())
        err = (y.double() - want).abs()
        assert bool((err <= tol.atol + tol.rtol * want.abs()).all())


def test_power_iteration_rejects_bad_cases():
    op = get_op(POWER)
    for kw in ({"dtype": "bfloat16", "params": {"rounds": 2}}, {"params": {"rounds": 0}},
               {"params": {"rounds": 2, "nope": 1}}, {"shape": [0], "params": {"rounds": 1}}):
        case = CaseSpec(name="bad", **{"shape": [8], "dtype": "float32", **kw})
        with pytest.raises(ValueError):
            op.validate_case(case)


# ---- scan ------------------------------------------------------------------------------------------------------
def test_scan_prompt_example():
    op = get_op(SCAN)
    case = CaseSpec(name="ex", shape=[4], dtype="int32")
    inputs = [{"x": _t(3, 1, 2, dtype=torch.int32)}, {"x": _t(5, 0, 4, 1, dtype=torch.int32)}]
    outs = op.expected(case, 2, inputs)
    assert outs[0]["y"].tolist() == [0, 3, 4] and outs[1]["y"].tolist() == [6, 11, 11, 15]
    assert outs[0]["y"].dtype == torch.int32


def test_scan_empty_ranks_and_int64_beyond_32_bits():
    op = get_op(SCAN)
    case = CaseSpec(name="ex", shape=[2], dtype="int64")
    big = 1 << 40
    inputs = [{"x": torch.zeros(0, dtype=torch.int64)}, {"x": _t(big, -3, dtype=torch.int64)},
              {"x": torch.zeros(0, dtype=torch.int64)}, {"x": _t(7, dtype=torch.int64)}]
    outs = op.expected(case, 4, inputs)
    assert [o["y"].tolist() for o in outs] == [[], [0, big], [], [big - 3]]


def test_scan_inputs_uneven_and_empty_rank():
    op = get_op(SCAN)
    case = CaseSpec(name="u", shape=[50], dtype="int32", params={"uneven": True})
    lens = {op.make_inputs(case, r, 4, 100 + r)["x"].numel() for r in range(4)}
    assert all(0 <= n <= 50 for n in lens)
    case = CaseSpec(name="e", shape=[50], dtype="int32", params={"empty_rank": 5})
    assert op.make_inputs(case, 1, 4, 3)["x"].numel() == 0 and op.make_inputs(case, 0, 4, 3)["x"].numel() == 50
    x = op.make_inputs(CaseSpec(name="d", shape=[1000], dtype="int32"), 0, 2, 1)["x"]
    assert x.dtype == torch.int32 and int(x.min()) >= 0 and int(x.max()) < 16


def test_scan_rejects_overflowing_cases():
    op = get_op(SCAN)
    op.validate_case(CaseSpec(name="ok", shape=[16777216], dtype="int32"))  # the 64 MiB benchmark, 8 ranks
    with pytest.raises(ValueError):
        op.validate_case(CaseSpec(name="big", shape=[1000], dtype="int32", int_range=[0, 1 << 28]))
    with pytest.raises(ValueError):
        op.validate_case(CaseSpec(name="big", shape=[1 << 24], dtype="int64", int_range=[0, 1 << 40]))
    with pytest.raises(ValueError):
        op.validate_case(CaseSpec(name="f", shape=[10], dtype="float32"))
