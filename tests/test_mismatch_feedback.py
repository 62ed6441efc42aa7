"""A mismatch says what to fix: every digit of both values, the absolute and relative error, the tolerance, and how
many elements are wrong; for a hidden case, the count and how far past the tolerance, never an index or a value."""

from __future__ import annotations

import torch

from commbench_env.golden.compare import compare_tensor
from commbench_env.judge.host.result import CaseResult, JudgeResult, Mismatch


def _result(visible: bool) -> JudgeResult:
    e = torch.linspace(1, 2, 64, dtype=torch.float64) * 10.6423
    g = e.clone()
    g[5] += 2e-12 * e[5]  # a difference that 6 significant digits would not show, past the tolerance
    g[9] += 1e-3
    m = compare_tensor(e, g, (1e-13, 1e-13))
    mm = Mismatch(case="c", rank=1, output="y", **m)
    return JudgeResult(task_id="t", task_hash="h", mode="check", world_size=2, device_mode="cpu",
                       verdict="wrong_answer", cases=[CaseResult(name="c", visible=visible, passed=False, mismatch=mm)])


def test_a_visible_mismatch_shows_digits_errors_tolerance_and_counts():
    r = _result(visible=True)
    mm = r.cases[0].mismatch
    assert mm.index == [5] and mm.wrong_count == 2 and mm.total_count == 64
    assert float(mm.expected) != float(mm.got) and mm.expected != mm.got  # enough digits to see the difference
    assert mm.abs_error and mm.rel_error and mm.rtol == 1e-13 and mm.worst_tolerance_ratio > 1e6
    text = r.feedback()
    assert f"expected {mm.expected}, got {mm.got}" in text
    assert "abs error" in text and "rel error" in text and "tolerance |got - expected| <= 1e-13 + 1e-13" in text
    assert "2 of 64 elements wrong" in text


def test_a_hidden_mismatch_shows_how_many_and_how_far_but_no_index_or_value():
    r = _result(visible=False)
    mm = r.cases[0].mismatch
    text = r.feedback()
    assert "hidden #1" in text and "2 elements wrong" in text and "times the tolerance" in text
    assert mm.expected not in text and mm.got not in text and "index" not in text and "of 64" not in text
    pub = r.public().cases[0].mismatch
    assert pub.index == [] and pub.expected == "" and pub.total_count == 0 and pub.abs_error is None


def test_integer_mismatches_report_the_difference():
    m = compare_tensor(torch.arange(10), torch.arange(10) + (torch.arange(10) == 4), (0.0, 0.0))
    assert m["index"] == [4] and m["expected"] == "4" and m["got"] == "5" and m["abs_error"] == 1.0
