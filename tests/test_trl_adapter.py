"""TRL's GRPOTrainer on CommBench: the reward function and the multi-turn tool env judge through the real judge, and
the example trains a tiny offline model for two steps on CPU, single turn and multi-turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commbench_env.cards import load_task
from commbench_env.errors import CommBenchError
from commbench_env.run.scoring import extract_code
from commbench_env.integrations import task_rows
from commbench_env.integrations.trl_adapter import CommBenchEpisodeReward, CommBenchReward, CommBenchToolEnv

ROOT = Path(__file__).resolve().parent.parent
TASK = "p2p/ring_shift"


def test_extract_code_takes_the_last_fenced_block():
    assert extract_code("text\n```python\na = 1\n```\nmore\n```py\nb = 2\n```\n") == "b = 2\n"
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"  # no block: the whole text
    msgs = [{"role": "assistant", "content": "here:\n```python\nx = 3\n```"}]
    assert extract_code(msgs) == "x = 3\n"


def test_task_rows_carry_prompt_task_and_world():
    rows = task_rows("p2p/ring_shift,collective/allreduce_ring", world_size=2, repeats=2)
    assert [r["task"] for r in rows] == [TASK, TASK, "collective/allreduce_ring", "collective/allreduce_ring"]
    assert all(r["world_size"] == 2 for r in rows)
    system, user = rows[0]["prompt"]
    assert system["role"] == "system" and "fenced code block" in system["content"]
    assert user["role"] == "user" and "def ring_shift" in user["content"]
    assert "submit" in task_rows(TASK, multi_turn=True)[0]["prompt"][0]["content"]


def test_reward_function_scores_through_the_real_judge(tmp_path):
    task = load_task(TASK)
    reward = CommBenchReward(parallel=2, trace_dir=str(tmp_path))
    extra: dict[str, list] = {}
    metrics: dict[str, float] = {}
    completions = [
        f"Here is my solution.\n```python\n{task.reference_source()}```\n",          # correct
        "I think the answer is to send the tensor around the ring.",                  # no code: garbage
        [{"role": "assistant", "content": f"```python\n{task.starter}```"}],           # conversational; raises
    ]
    try:
        rewards = reward(prompts=["p"] * 3, completions=completions, task=[TASK] * 3, world_size=[2] * 3,
                         log_extra=lambda col, vals: extra.setdefault(col, vals),
                         log_metric=lambda name, v: metrics.setdefault(name, v))
        good, garbage, starter = reward.last_scores
        assert rewards[0] >= 0.5 and good.verdict == "pass" and good.correct and good.speedup > 0
        assert rewards[1] == 0.0 and garbage.verdict == "compile_error"
        assert rewards[2] == 0.0 and starter.verdict == "runtime_error" and "NotImplementedError" in starter.feedback
        assert extra["commbench_verdict"] == ["pass", "compile_error", "runtime_error"]
        assert metrics["commbench/correct"] == pytest.approx(1 / 3)
        assert reward.verdicts == {"pass": 1, "compile_error": 1, "runtime_error": 1}
        with pytest.raises(CommBenchError, match="'task' column"):
            reward(prompts=["p"], completions=["x"])
    finally:
        reward.close()


def test_tool_env_episodes_and_their_rewards(tmp_path):
    task = load_task(TASK)
    row = task_rows(TASK, world_size=2, multi_turn=True)[0]
    submitted, unfinished, silent = (CommBenchToolEnv(max_turns=3, trace_dir=str(tmp_path)) for _ in range(3))
    try:
        for env in (submitted, unfinished, silent):
            assert env.reset(**row) is None
        fb = submitted.check(task.starter)
        assert "runtime_error" in fb and "NotImplementedError" in fb
        assert "Submitted. Reward" in submitted.submit(task.reference_source())
        assert "episode is over" in submitted.check(task.reference_source())  # nothing runs after the end
        # sanitize is offered to every task (TRL's tools are the class's): a torch task runs nothing, the code is kept
        assert "nothing was run" in unfinished.sanitize(task.reference_source())
        assert "pass" in unfinished.check("")  # never submitted: its last code is scored
        rewards = CommBenchEpisodeReward(parallel=3)(prompts=["p"] * 3, completions=["c"] * 3,
                                                     environments=[submitted, unfinished, silent])
        assert rewards[0] >= 0.5 and rewards[1] >= 0.5 and rewards[2] == 0.0
        # the instance is reused for the next rollout: reset starts a fresh episode on the same sandbox
        submitted.reset(**row)
        assert "compile_error" in submitted.compile("def ring_shift(x:\n")
        assert CommBenchEpisodeReward()(prompts=["p"], completions=["c"], environments=[submitted]) == [0.0]
    finally:
        for env in (submitted, unfinished, silent):
            env._drop_env()


def test_tool_env_methods_are_the_tools_trl_exposes():
    """What GRPOTrainer reads from the class: reset plus one documented tool per env tool, nothing else public."""
    import inspect

    from transformers.utils import get_json_schema

    public = [n for n, _ in inspect.getmembers(CommBenchToolEnv, predicate=inspect.isfunction) if not n.startswith("_")]
    assert sorted(public) == ["benchmark", "check", "compile", "profile", "reset", "sanitize", "submit"]
    schema = get_json_schema(CommBenchToolEnv().submit)
    assert schema["function"]["name"] == "submit"
    assert schema["function"]["parameters"]["required"] == ["source"]


def _run_example(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "summary.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "trl_grpo.py"), "--steps", "2", "--tasks", TASK,
                           "--json", str(out), *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(out.read_text())


def test_grpo_single_turn_trains_on_cpu(tmp_path):
    summary = _run_example(tmp_path)
    assert summary["steps"] == 2 and len(summary["logs"]) == 2
    assert all("rewards/commbench/mean" in h for h in summary["logs"])
    # every completion went through the judge (the random model writes gibberish: it never passes)
    assert sum(summary["verdicts"].values()) == 2 * 4 and "pass" not in summary["verdicts"]


def test_grpo_multi_turn_trains_on_cpu(tmp_path):
    summary = _run_example(tmp_path, "--multi-turn", "--max-turns", "2")
    assert summary["steps"] == 2
    assert all("rewards/commbench_episode/mean" in h and "tools/call_frequency" in h for h in summary["logs"])
    assert sum(summary["verdicts"].values()) == 2 * 4
