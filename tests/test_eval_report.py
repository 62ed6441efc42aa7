"""Evaluation runs (parallel, samples, resume, infrastructure retries) and reports recomputed from traces."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from commbench_env.agents.base import AgentCard
from commbench_env.cards import select_tasks
from commbench_env.run.evaluation import RESULTS, run_eval
from commbench_env.run.report import build_report, pass_at_k
from commbench_env.judge.host.result import JudgeResult
from commbench_env.score.reward import RewardBreakdown
from commbench_env.trace.records import EpisodeEnd, EpisodeStart, TraceAction, TraceStep, TraceWriter, TurnMeta

TASKS = "p2p/ring_shift,collective/allreduce_ring"
SUBMIT = AgentCard(name="reference-submit", kind="reference", max_turns=2, params={"plan": ["submit:reference"]})


def test_eval_runs_samples_in_parallel_and_resumes(tmp_path):
    tasks = select_tasks(TASKS)
    first = run_eval(SUBMIT, tasks, sandbox="local-cpu", out=tmp_path, parallel=2, samples=2, world=2)
    assert len(first) == 4 and all(r["status"] == "done" and r["correct"] for r in first)
    assert len(list((tmp_path / "traces").glob("*.jsonl"))) == 4
    # an interrupted run: the last result line never got written
    lines = (tmp_path / RESULTS).read_text().splitlines()
    (tmp_path / RESULTS).write_text("\n".join(lines[:-1]) + "\n")
    missing = json.loads(lines[-1])["key"]
    second = run_eval(SUBMIT, tasks, sandbox="local-cpu", out=tmp_path, parallel=2, samples=2, world=2)
    assert [r["key"] for r in second] == [missing]
    assert len(run_eval(SUBMIT, tasks, sandbox="local-cpu", out=tmp_path, samples=2, world=2)) == 0


class SlowReferenceAgent:
    """The reference agent, thinking 1.5 s before each action as a model would: an episode is surely playing
    for a while after the one before it finished."""

    def __init__(self, card):
        from commbench_env.agents.reference import ReferenceAgent

        self.name = card.name
        self.inner = ReferenceAgent(AgentCard(name=card.name, kind="reference",
                                              params={"plan": ["check:starter", "check:reference", "submit:reference"]}))

    def reset(self, observation, info):
        self.inner.reset(observation, info)

    def act(self, observation, info):
        import time

        time.sleep(1.5)
        return self.inner.act(observation, info)

    def close(self):
        pass


class FlakyInfraAgent:
    """Raises an infrastructure error the first time it acts (as a dead sandbox would), then submits."""

    failures = 0

    def __init__(self, card):
        self.name = card.name
        from commbench_env.agents.reference import ReferenceAgent

        self.inner = ReferenceAgent(AgentCard(name=card.name, kind="reference", params={"plan": ["submit:reference"]}))

    def reset(self, observation, info):
        self.inner.reset(observation, info)

    def act(self, observation, info):
        from commbench_env.errors import SandboxError

        if FlakyInfraAgent.failures == 0:
            FlakyInfraAgent.failures += 1
            raise SandboxError("the sandbox died")
        return self.inner.act(observation, info)

    def close(self):
        pass


def test_infrastructure_errors_are_retried_not_scored(tmp_path):
    card = AgentCard(name="flaky", kind="tests.test_eval_report:FlakyInfraAgent", max_turns=2)
    recs = run_eval(card, select_tasks("p2p/ring_shift"), sandbox="local-cpu", out=tmp_path, world=2)
    assert recs[0]["status"] == "done" and recs[0]["attempts"] == 2 and recs[0]["correct"]
    assert len(list((tmp_path / "traces").glob("*.jsonl"))) == 1  # the failed attempt left no trace behind


def test_pass_at_k_matches_the_formula():
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))


def _fake_trace(path, task, category, rewards_parts, agent="m", meta=None, hints=False):
    """A trace written with the real records, with a chosen outcome (what a run of a model would have written)."""
    w = TraceWriter(path)
    w.write(EpisodeStart(task_id=task, task_hash="h", agent={"name": agent}, config={"hints": hints},
                         task_card={"category": category, "difficulty": "medium", "language": "torch"}))
    turns = len(rewards_parts)
    for i, (verdict, parts) in enumerate(rewards_parts, 1):
        result = JudgeResult(task_id=task, task_hash="h", mode="full" if i == turns else "check", world_size=2,
                             device_mode="cpu", verdict=verdict)
        breakdown = RewardBreakdown(compiled=True, case_fraction=1.0 if parts.get("correct") else 0.0,
                                    **{"reward": 0.0, "correct": False, **parts}) if parts else None
        w.write(TraceStep(turn=i, action=TraceAction(tool="submit" if i == turns else "check"), judge_result=result,
                          reward=parts.get("reward", 0.0) if i == turns else 0.0, reward_parts=breakdown,
                          meta=TurnMeta(**(meta or {}))))
    w.write(EpisodeEnd(reward=rewards_parts[-1][1].get("reward", 0.0), turns=turns))
    w.close()


def test_the_report_says_which_runs_saw_hints(tmp_path):
    ok = {"reward": 1.0, "correct": True, "speedup": 1.0, "band": "on_par"}
    _fake_trace(tmp_path / "with" / "traces" / "a.jsonl", "p2p/x", "p2p", [("pass", ok)], hints=True)
    _fake_trace(tmp_path / "mixed" / "traces" / "a.jsonl", "p2p/x", "p2p", [("pass", ok)], hints=True)
    _fake_trace(tmp_path / "mixed" / "traces" / "b.jsonl", "p2p/y", "p2p", [("pass", ok)])
    _fake_trace(tmp_path / "without" / "traces" / "a.jsonl", "p2p/x", "p2p", [("pass", ok)])
    ms, md, _ = build_report([tmp_path / "with", tmp_path / "mixed", tmp_path / "without"], tmp_path / "out")
    assert [m.hints for m in ms] == ["yes", "mixed", "no"]
    assert "| with | m | yes |" in md.read_text()


def test_report_matches_a_hand_calculation(tmp_path):
    run = tmp_path / "runA"
    t = run / "traces"
    ok_fast = {"reward": 1.0, "correct": True, "speedup": 2.0, "band": "better"}
    ok_slow = {"reward": 0.75, "correct": True, "speedup": 0.5, "band": "degraded"}
    wrong = {"reward": 0.0, "correct": False}
    meta = {"tokens_in": 100, "tokens_out": 50, "cost_usd": 0.01}
    _fake_trace(t / "a1.jsonl", "p2p/x", "p2p", [("wrong_answer", {}), ("pass", ok_fast)], meta=meta)
    _fake_trace(t / "a2.jsonl", "p2p/x", "p2p", [("wrong_answer", wrong)], meta=meta)
    _fake_trace(t / "b1.jsonl", "collective/y", "collective", [("pass", ok_slow)], meta=meta)
    _fake_trace(t / "b2.jsonl", "collective/y", "collective", [("pass", ok_fast)], meta=meta)
    (t / "partial.jsonl").write_text('{"type": "episode_start", "schema": "commbench-trace/1", "task_id": "z"}\n')
    other = tmp_path / "runB"
    _fake_trace(other / "traces" / "c.jsonl", "p2p/x", "p2p", [("pass", ok_fast)], agent="n")
    (m, mb), md, pngs = build_report([run, other], tmp_path / "out")
    assert m.episodes == 4 and m.tasks == 2  # the unfinished trace is not counted
    assert m.mean_reward == pytest.approx((1.0 + 0 + 0.75 + 1.0) / 4)
    assert m.pass_rate == pytest.approx(3 / 4)
    assert m.pass_good == pytest.approx(2 / 4)
    assert m.gm_speedup == pytest.approx((2.0 * 0.5 * 2.0) ** (1 / 3))
    assert m.pass_x_gm == pytest.approx(0.75 * m.gm_speedup)
    assert m.pass_at[1] == pytest.approx((0.5 + 1.0) / 2) and m.pass_at[2] == pytest.approx(1.0)
    assert m.turns_to_first_pass == pytest.approx((2 + 1 + 1) / 3)
    assert m.tokens_per_episode == pytest.approx((150 * 2 + 150 + 150 + 150) / 4)
    assert m.cost_per_episode == pytest.approx((0.02 + 0.01 + 0.01 + 0.01) / 4)
    assert m.by["category"]["p2p"]["pass_rate"] == pytest.approx(0.5)
    assert mb.agent == "n" and mb.pass_rate == 1.0
    text = md.read_text()
    assert "| runA | m | no | 4 | 2 | 0.688 | 0.750 | 0.500 |" in text and "runB" in text
    assert all(p.is_file() and p.stat().st_size > 1000 for p in pngs)


def test_killed_eval_resumes_with_only_the_missing_episodes(tmp_path):
    """`commbench eval` killed with SIGKILL after its first episode; the same command again finishes the rest."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "commbench_env.cli", "eval", "--agent", "reference-submit", "--tasks",
           "p2p/ring_shift,utility/barrier_p2p,collective/allreduce_ring", "--world", "2", "--out", str(tmp_path)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    results = tmp_path / RESULTS
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (results.is_file() and results.read_text().strip()):
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    done_before = {json.loads(x)["key"] for x in results.read_text().splitlines() if x.strip()}
    assert 1 <= len(done_before) < 3
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"{len(done_before)} episode(s) already done" in again.stdout
    keys = [json.loads(x)["key"] for x in results.read_text().splitlines() if x.strip()]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == 3  # each episode exactly once


def _wait_for_lines(path, n: int, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (path.is_file() and len(path.read_text().splitlines()) >= n):
        time.sleep(0.1)
    assert path.is_file() and len(path.read_text().splitlines()) >= n, f"no {n} line(s) in {path} in {timeout} s"


def test_ctrl_c_stops_eval_within_seconds_and_the_rerun_counts_each_episode_once(tmp_path):
    """Ctrl-C (SIGINT to the process group) while the second of three episodes plays: the run stops within 20 s,
    writes the finished episode as done and the playing one as interrupted (never pass), leaves no sandbox
    process behind; the same command again plays only what is missing, and the report counts each once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from commbench_env.run.evaluation import load_run_traces
    from commbench_env.trace.records import read_trace

    tasks = "collective/allreduce_ring,p2p/ring_shift,utility/barrier_p2p"
    card = tmp_path / "slow.toml"
    card.write_text('name = "slow-reference"\nkind = "tests.test_eval_report:SlowReferenceAgent"\nmax_turns = 4\n')
    cmd = [sys.executable, "-m", "commbench_env.cli", "eval", "--agent", str(card), "--tasks", tasks,
           "--world", "2", "--out", str(tmp_path / "run")]
    repo = Path(__file__).resolve().parent.parent  # the agent's class is imported from tests/
    out = tmp_path / "run"
    # as from a terminal: a shell that starts this suite in the background (`.ci/run &`) leaves SIGINT ignored,
    # which children inherit, and Python then installs no Ctrl-C handler at all
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         cwd=repo, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    results = out / RESULTS
    _wait_for_lines(results, 1, 300)
    time.sleep(1.0)  # the second episode is playing now: its agent thinks 1.5 s before each of its three turns
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)
    _, errs = p.communicate(timeout=60)
    stopped_s = time.monotonic() - t0
    assert stopped_s < 20, f"took {stopped_s:.1f} s to stop"
    assert p.returncode == 130, errs
    assert "run the same command again" in errs
    recs = [json.loads(x) for x in results.read_text().splitlines()]
    statuses = {r["key"]: r["status"] for r in recs}
    assert list(statuses.values()).count("done") >= 1 and "interrupted" in statuses.values(), statuses
    for trace in sorted((out / "traces").glob("*.jsonl")):
        t = read_trace(trace)
        if t.end and t.end.status == "interrupted":
            assert t.end.final_verdict is None and t.end.reward == 0.0
    leftover = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
    assert not leftover, f"processes of the stopped run still run: {leftover}"
    from commbench_env.run.evaluation import unscored_episodes

    assert unscored_episodes(out).get("interrupted", 0) >= 1  # counted apart, never scored
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=repo)
    assert again.returncode == 0, again.stderr
    assert unscored_episodes(out) == {}
    done = [json.loads(x) for x in results.read_text().splitlines() if json.loads(x)["status"] == "done"]
    assert sorted(r["key"] for r in done) == sorted(f"{t}#0" for t in tasks.split(","))
    counted = load_run_traces(out)
    assert sorted(t.task_id for t in counted) == sorted(tasks.split(","))  # each (task, sample) once


def test_a_run_folder_without_an_eval_ledger_has_no_unscored_episodes(tmp_path):
    """`commbench run` writes one summary per episode (no key, no status): nothing there is "unscored"."""
    import json

    from commbench_env.run.evaluation import unscored_episodes

    (tmp_path / "results.jsonl").write_text(json.dumps({"task": "p2p/ring_shift", "verdict": "pass", "reward": 1.0})
                                            + "\n")
    assert unscored_episodes(tmp_path) == {}
