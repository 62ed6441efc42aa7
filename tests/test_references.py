"""Every task's reference passes at world 2 and 4; user-style submissions get the verdicts a user expects."""

from __future__ import annotations

import pytest

from commbench_env.cards import load_all_tasks
from commbench_env.judge.result import Verdict

from .conftest import SUBMISSIONS

TASKS = [t.id for t in load_all_tasks() if t.card.language.value == "torch"]
WORLDS = [2, 4]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("task", TASKS)
def test_reference_passes(evaluate, task, world):
    res = evaluate(task, mode="check", world=world)
    assert res.verdict == Verdict.passed, res.feedback()
    assert res.correct and all(c.passed for c in res.cases)
    assert any(not c.visible for c in res.cases)


@pytest.mark.parametrize("task", TASKS)
def test_reference_benchmark_is_verified(evaluate, task):
    res = evaluate(task, mode="benchmark", world=2)
    assert res.verdict == Verdict.passed, res.feedback()
    assert res.benchmark and all(s.verified and s.time_us > 0 for s in res.benchmark)


def _submissions(kind: str) -> list[tuple[str, str]]:
    out = []
    for p in sorted(SUBMISSIONS.rglob(f"{kind}.py")):
        task = "/".join(p.parent.relative_to(SUBMISSIONS).parts)
        out.append((task, str(p)))
    return out


@pytest.mark.parametrize("task,path", _submissions("wrong"))
def test_wrong_submissions_fail_with_a_mismatch(evaluate, task, path):
    from pathlib import Path

    res = evaluate(task, Path(path), mode="check", world=4)
    assert res.verdict == Verdict.wrong_answer, res.feedback()
    first = next(c for c in res.cases if not c.passed)
    assert first.mismatch is not None and 0 <= first.mismatch.rank < 4


@pytest.mark.parametrize("task,path", _submissions("naive"))
def test_naive_submissions_pass(evaluate, task, path):
    from pathlib import Path

    res = evaluate(task, Path(path), mode="full", world=4)
    assert res.verdict == Verdict.passed, res.feedback()


@pytest.mark.parametrize("task,path", _submissions("local_only"))
def test_local_only_cheats_fail(evaluate, task, path):
    from pathlib import Path

    res = evaluate(task, Path(path), mode="check", world=4)
    assert res.verdict == Verdict.wrong_answer, res.feedback()


def test_every_task_has_a_wrong_submission():
    have = {t for t, _ in _submissions("wrong")}
    assert set(TASKS) <= have
