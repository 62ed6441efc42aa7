"""What the agent sees of a result: hidden cases by number and pass/fail, never their names or values.

A real episode in `local-cpu` with a submission that is right on the visible cases, wrong in value on one hidden
case and raises (naming the case's shape in its message) on another; nothing of either reaches the observation or
`info`, while the trace (host side) keeps the full result.
"""

from __future__ import annotations

import json

import pytest

from commbench_env.cards import load_task
from commbench_env.episode.gym_env import CommBenchEnv
from commbench_env.judge.host.result import CaseResult, JudgeResult, Mismatch, RankStatus, Verdict
from commbench_env.trace.records import read_trace

TASK = "collective/allreduce_ring"
REFERENCE = load_task(TASK).reference_source()

# right on 1024 and [64, 33] (the visible cases), wrong on one hidden shape, raising on the rest
CHEAT = REFERENCE + '''

_right = all_reduce


def all_reduce(x):
    if x.numel() in (1024, 64 * 33):
        return _right(x)
    if x.numel() == 4099:
        return _right(x) + 0.5
    raise ValueError(f"no luck with {tuple(x.shape)}")
'''


def _hidden(task_id: str) -> list:
    return [c for c in load_task(task_id).card.cases if not c.visible]


def test_observation_and_info_name_no_hidden_case_and_show_no_hidden_value(trace_dir):
    env = CommBenchEnv(task=TASK, sandbox="local-cpu", max_turns=3, world_size=2, trace_dir=str(trace_dir),
                       reference="none")
    try:
        env.reset(seed=0)
        obs, _, _, _, info = env.step({"tool": "check", "source": CHEAT})
        full = env.last_result
    finally:
        env.close()
    assert full is not None and full.verdict == Verdict.runtime_error  # the raise ends the run
    assert any(not c.visible and c.error and "no luck" in c.error for c in full.cases)
    wrong = next(c for c in full.cases if c.name == "odd-length")
    assert wrong.mismatch and wrong.mismatch.expected and wrong.mismatch.got  # the host keeps the values
    seen = obs["feedback"] + json.dumps(info)
    for case in _hidden(TASK):
        assert case.name not in seen, f"hidden case {case.name!r} leaked"
    assert wrong.mismatch.expected not in seen and wrong.mismatch.got not in seen
    public = JudgeResult.model_validate(info["judge_result"])
    assert [c.passed for c in public.cases] == [c.passed for c in full.cases]
    ran = [c for c in full.cases if not c.visible]
    assert [c.name for c in public.cases if not c.visible] == [f"hidden #{i}" for i in range(1, len(ran) + 1)]
    assert "no luck with (3,)" in seen  # the candidate's own message stays: it may print its inputs anyway
    assert "FAIL hidden #" in obs["feedback"] and "PASS small-f32" in obs["feedback"]
    steps = read_trace(env.trace_path).steps
    traced = steps[-1].judge_result
    assert next(c for c in traced.cases if c.name == "odd-length").mismatch.expected == wrong.mismatch.expected


@pytest.mark.parametrize("visible", [True, False])
def test_public_view_scrubs_names_from_every_text(visible):
    name = "hidden-shape-4099"
    mm = Mismatch(case=name, rank=1, output="y", reason="value", index=[17], expected="3.25", got="3.75",
                  detail=f"in {name}", hidden=not visible, wrong_count=3, total_count=4099)
    r = JudgeResult(task_id="t", task_hash="h", mode="check", world_size=2, device_mode="cpu",
                    verdict=Verdict.wrong_answer, summary=f"rank 1 raised in case {name}",
                    cases=[CaseResult(name=name, visible=visible, passed=False, mismatch=mm, error=f"{name} failed")],
                    ranks=[RankStatus(rank=1, state="ok", stderr=f"case {name}")])
    text = r.public().model_dump_json() + r.feedback()
    if visible:
        assert name in text and "3.75" in text
    else:
        assert name not in text and "3.75" not in text and "3.25" not in text and "[17]" not in text
        assert "hidden #1" in text


def test_a_hidden_dtype_mismatch_reads_as_one_without_the_dtypes():
    mm = Mismatch(case="hidden-int", rank=0, output="y", reason="dtype", expected="torch.int64", got="torch.float32",
                  hidden=True)
    r = JudgeResult(task_id="t", task_hash="h", mode="check", world_size=2, device_mode="cpu",
                    verdict=Verdict.wrong_answer,
                    cases=[CaseResult(name="hidden-int", visible=False, passed=False, mismatch=mm)])
    text = r.feedback()
    assert "FAIL hidden #1: rank 0, output 'y': wrong dtype" in text
    assert "expected ," not in text and "int64" not in text

