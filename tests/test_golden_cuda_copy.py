"""Golden ops of the one-GPU copy tasks (utility/vector_copy_widths, utility/tma_bulk_copy), checked on the CPU
against small hand-made examples and plain-Python computations."""

from __future__ import annotations

import math

import pytest
import torch

from commbench_env.cards import CaseSpec, load_task
from commbench_env.golden import get_op


def _inputs(op, case, world, seeds=None):
    seeds = seeds or [1000 + 17 * r for r in range(world)]
    return [op.make_inputs(case, r, world, seeds[r]) for r in range(world)]


# ---- offset_copy -----------------------------------------------------------------------------------------------
def test_offset_copy_by_hand():
    op = get_op("offset_copy")
    case = CaseSpec(name="c", shape=[6], dtype="int32",
                    params={"src_offset": 2, "dst_offset": 1, "length": 3, "dst_pad": 2})
    x = torch.tensor([10, 11, 12, 13, 14, 15], dtype=torch.int32)
    (y,) = (e["y"] for e in op.expected(case, 1, [{"x": x}]))
    assert y.dtype == torch.int32 and y.tolist() == [-1, 12, 13, 14, -1, -1]


@pytest.mark.parametrize("dtype", ["uint8", "int32", "int64"])
def test_offset_copy_data_never_equals_the_fill(dtype):
    op = get_op("offset_copy")
    case = CaseSpec(name="c", shape=[50000], dtype=dtype, params={"length": 50000})
    x = _inputs(op, case, 1)[0]["x"]
    fill = torch.full((), -1, dtype=x.dtype)
    assert x.dtype == getattr(torch, dtype) and not bool((x == fill).any())
    assert x.unique().numel() > 200  # wide range: a shifted or stale element shows


def test_offset_copy_window_and_untouched_bytes_are_checked():
    op = get_op("offset_copy")
    case = CaseSpec(name="c", shape=[40], dtype="uint8",
                    params={"src_offset": 7, "dst_offset": 9, "length": 13, "dst_pad": 2})
    inputs = _inputs(op, case, 2)
    exp = op.expected(case, 2, inputs)
    assert [e["y"].numel() for e in exp] == [24, 24]
    good = [{"y": e["y"].clone()} for e in exp]
    assert op.verify(case, 2, inputs, good, (0.0, 0.0)) is None
    spill = [{"y": e["y"].clone()} for e in exp]
    spill[1]["y"][8] = 0  # one byte before the window overwritten (a whole-word store)
    m = op.verify(case, 2, inputs, spill, (0.0, 0.0))
    assert m and m["rank"] == 1 and m["index"] == [8]
    shifted = [{"y": e["y"].clone()} for e in exp]
    shifted[0]["y"][9:22] = inputs[0]["x"][8:21]  # off by one element
    assert op.verify(case, 2, inputs, shifted, (0.0, 0.0))


def test_offset_copy_rejects_bad_cases():
    op = get_op("offset_copy")
    with pytest.raises(ValueError, match="exceeds"):
        op.validate_case(CaseSpec(name="c", shape=[10], dtype="uint8", params={"src_offset": 5, "length": 6}))
    with pytest.raises(ValueError, match="dtype"):
        op.validate_case(CaseSpec(name="c", shape=[10], dtype="float32", params={"length": 6}))
    with pytest.raises(ValueError, match="length"):
        op.validate_case(CaseSpec(name="c", shape=[10], dtype="uint8", params={}))


def test_offset_copy_benchmark_case():
    op = get_op("offset_copy")
    perf = load_task("utility/vector_copy_widths").card.performance
    case = op.size_case(perf, 1 << 20, 2)
    op.validate_case(case)
    p = case.params
    assert p["length"] == 1 << 20 and case.shape == [p["src_offset"] + p["length"] + 3]
    assert op.metric_bytes(case, 2) == 1 << 20
    assert (p["src_offset"] - p["dst_offset"]) % 16 != 0  # the ends are misaligned against each other


# ---- row_rms_scale ---------------------------------------------------------------------------------------------
def test_row_rms_scale_by_hand():
    op = get_op("row_rms_scale")
    case = CaseSpec(name="c", shape=[2, 2], dtype="float32", params={"eps_e9": 1000})
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    exp = op.expected(case, 1, [{"x": x}])[0]
    r0 = 1 / math.sqrt(12.5 + 1e-6)
    assert exp["rstd"].tolist() == pytest.approx([r0, 1 / math.sqrt(1e-6)], rel=1e-12)
    assert exp["y"].reshape(-1).tolist() == pytest.approx([3 * r0, 4 * r0, 0.0, 0.0], rel=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_row_rms_scale_matches_a_plain_loop(dtype):
    op = get_op("row_rms_scale")
    case = CaseSpec(name="c", shape=[5, 7], dtype=dtype, params={"eps_e9": 500000000})
    (inp,) = _inputs(op, case, 1)
    x = inp["x"]
    assert x.dtype == getattr(torch, dtype) and x.shape == (5, 7)
    exp = op.expected(case, 1, [inp])[0]
    for i in range(5):
        row = [float(v) for v in x[i]]
        r = 1 / math.sqrt(sum(v * v for v in row) / 7 + 0.5)
        assert float(exp["rstd"][i]) == pytest.approx(r, rel=1e-12)
        assert [float(v) for v in exp["y"][i]] == pytest.approx([v * r for v in row], rel=1e-12, abs=1e-300)


def test_row_rms_scale_rows_differ_in_magnitude_and_scale_applies():
    op = get_op("row_rms_scale")
    case = CaseSpec(name="c", shape=[200, 64], dtype="float32", params={"eps_e9": 1000, "scale": 1e-4})
    x = _inputs(op, case, 1)[0]["x"]
    rms = x.pow(2).mean(1).sqrt()
    assert float(rms.max() / rms.min()) > 20 and float(rms.median()) < 1e-3


def test_row_rms_scale_verify_catches_a_wrong_row_and_a_wrong_rstd():
    op = get_op("row_rms_scale")
    task = load_task("utility/tma_bulk_copy").card
    case = CaseSpec(name="c", shape=[8, 33], dtype="bfloat16", params={"eps_e9": 1000})
    inputs = _inputs(op, case, 2)
    tol = (task.tolerance_for("bfloat16").rtol, task.tolerance_for("bfloat16").atol)
    exp = op.expected(case, 2, inputs)
    got = [{k: v.to(torch.bfloat16) for k, v in e.items()} for e in exp]
    assert op.verify(case, 2, inputs, got, tol) is None
    bad = [{k: v.clone() for k, v in g.items()} for g in got]
    bad[1]["y"][3] = inputs[1]["x"][3]  # a row left unscaled
    assert op.verify(case, 2, inputs, bad, tol)["rank"] == 1
    bad = [{k: v.clone() for k, v in g.items()} for g in got]
    bad[0]["rstd"][5] *= 1.1
    assert op.verify(case, 2, inputs, bad, tol)["output"] == "rstd"


def test_row_rms_scale_benchmark_case():
    op = get_op("row_rms_scale")
    perf = load_task("utility/tma_bulk_copy").card.performance
    case = op.size_case(perf, 64 << 20, 2)
    op.validate_case(case)
    assert case.shape == [8192, 4096] and case.dtype == "bfloat16" and op.metric_bytes(case, 2) == 64 << 20
