"""The Gymnasium contract: registration, spaces, check_env, episodes, garbage actions, budgets, traces, replay."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import commbench_env  # noqa: F401 - registers CommBench-v0
from commbench_env.agents import load_agent
from commbench_env.agents.base import AgentCard
from commbench_env.cards import load_task
from commbench_env.episode.gym_env import CommBenchEnv
from commbench_env.run.runner import play_episode
from commbench_env.trace.records import format_trace, read_trace

TASK = "collective/allreduce_ring"


@pytest.fixture()
def env(trace_dir):
    e = gymnasium.make("CommBench-v0", task=TASK, sandbox="local-cpu", max_turns=4, world_size=2,
                       trace_dir=str(trace_dir))
    yield e
    e.close()


def test_registered_nondeterministic():
    spec = gymnasium.spec("CommBench-v0")
    assert spec.nondeterministic is True
    assert spec.entry_point == "commbench_env.episode.gym_env:CommBenchEnv"


def test_check_env_passes(trace_dir):
    e = gymnasium.make("CommBench-v0", task=TASK, max_turns=3, world_size=2, trace_dir=str(trace_dir),
                       reference="none").unwrapped  # keeps the registered spec (nondeterministic=True)
    try:
        check_env(e, skip_render_check=True)
    finally:
        e.close()


def test_reset_observation(env):
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert obs["turn"] == 0 and obs["feedback"] == ""
    assert "def all_reduce" in obs["task"] and "Forbidden" in obs["task"]
    assert info["task_hash"] == load_task(TASK).hash and info["world_size"] == 2


def test_episode_check_then_submit(env):
    task = load_task(TASK)
    env.reset(seed=1)
    obs, r, term, trunc, info = env.step({"tool": "check", "source": task.starter})
    assert (r, term, trunc) == (0.0, False, False)
    assert info["verdict"] == "runtime_error" and "NotImplementedError" in obs["feedback"]
    obs, r, term, trunc, info = env.step({"tool": 1, "source": task.reference_source()})
    assert info["verdict"] == "pass" and not term
    obs, r, term, trunc, info = env.step({"tool": "submit", "source": ""})  # empty source: reuse the last code
    assert term and not trunc and info["verdict"] == "pass"
    assert 0.5 <= r <= 1.0
    parts = info["reward_parts"]
    assert parts["correct"] and parts["speedup"] > 0 and parts["band"] in ("better", "on_par", "degraded", "severely_degraded")
    assert env.observation_space.contains(obs)
    with pytest.raises(gymnasium.error.ResetNeeded):
        env.step({"tool": "check", "source": ""})


def test_sanitize_on_a_torch_task_is_answered_without_the_judge(env):
    """The agent's slip, not an infrastructure error: no judge run (a pooled sandbox is not recycled for it), and
    the code sent is kept as the latest."""
    env.reset(seed=1)
    obs, r, term, trunc, info = env.step({"tool": "sanitize", "source": load_task(TASK).reference_source()})
    assert "CUDA tasks" in obs["feedback"] and "written in torch" in obs["feedback"]
    assert info["judge_result"] is None and info["verdict"] is None and (r, term, trunc) == (0.0, False, False)
    obs, r, term, trunc, info = env.step({"tool": "check", "source": ""})  # reuses the code the sanitize call sent
    assert info["verdict"] == "pass"


@pytest.mark.parametrize("action", ["", "hello", 42, None, [1, 2], {"tool": "explode"}, {"tool": 9},
                                    {"source": "x"}, {"tool": "check", "source": 5}, "{not json",
                                    {"tool": "check", "files": {"other.py": "x"}}, {"tool": "check", "bogus": 1}])
def test_garbage_actions_give_feedback_not_exceptions(env, action):
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step(action)
    assert r == 0.0 and not term
    assert "Could not parse the action" in obs["feedback"] or "No source yet" in obs["feedback"]
    assert env.observation_space.contains(obs)


def _deep(n: int) -> dict:
    d: dict = {}
    for _ in range(n):
        d = {"x": d}
    return d


@pytest.mark.parametrize("action,why", [
    ({"tool": "check", "source": "def all_reduce(x):\n    return x  # \ud800\n"}, "not valid Unicode text"),
    ({"tool": "check", "source": "def all_reduce(x):\n    return x\x00\n"}, "NUL character (line 2)"),
    ({"tool": np.array([1, 2]), "source": "x = 1"}, "array of shape (2,)"),
    ({"tool": "check", "source": "x = 1", "meta": _deep(5000)}, "not nested deeply"),
    ('{"tool": "check", "meta": ' + '{"a": ' * 5000 + "1" + "}" * 5001, "nested too deeply"),
    ([[[]]] * 3, "must be a dict or a string"),
    ({"tool": "check", "source": b"x = 1"}, "must be text, got bytes"),
])
def test_bad_input_gives_feedback_and_never_a_lost_turn(env, action, why):
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step(action)
    assert why in obs["feedback"] and obs["turn"] == 1 and r == 0.0 and not (term or trunc)
    assert env.observation_space.contains(obs)
    obs, r, term, trunc, info = env.step({"tool": "check", "source": load_task(TASK).reference_source()})
    assert info["verdict"] == "pass" and obs["turn"] == 2  # the episode goes on, counting every turn once
    assert [s.turn for s in read_trace(env.unwrapped.trace_path).steps] == [1, 2]


def test_a_message_fence_follows_the_task_language():
    from commbench_env.episode.actions import ParseError, parse_action

    msg = "tool: check\n```{lang}\nbody\n```"
    assert parse_action(msg.format(lang="cuda"), "solution.cu", "cuda").files == {"solution.cu": "body\n"}
    assert parse_action(msg.format(lang=""), "solution.cu", "cuda").files == {"solution.cu": "body\n"}
    assert parse_action(msg.format(lang="python"), "solution.py", "torch").files == {"solution.py": "body\n"}
    assert parse_action(msg.format(lang="cuda"), "solution.py", "torch").files == {}  # no python block in it
    with pytest.raises(ParseError, match="NUL"):
        parse_action("tool: check\n```cuda\na\x00b\n```", "solution.cu", "cuda")


def test_random_actions_from_the_space(env):
    env.reset(seed=0)
    env.action_space.seed(3)
    for _ in range(3):
        obs, r, term, trunc, info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
        if term or trunc:
            break


def test_turn_budget_truncates_and_scores_last_code(trace_dir):
    e = CommBenchEnv(task=TASK, max_turns=2, world_size=2, trace_dir=str(trace_dir))
    task = load_task(TASK)
    try:
        e.reset()
        _, r, term, trunc, _ = e.step({"tool": "compile", "source": task.reference_source()})
        assert not (term or trunc)
        obs, r, term, trunc, info = e.step({"tool": "check", "source": ""})
        assert trunc and not term and r > 0.5
        assert "Turn budget used up" in obs["feedback"]
    finally:
        e.close()


def test_terminate_on_solve(trace_dir):
    e = CommBenchEnv(task=TASK, max_turns=5, world_size=2, trace_dir=str(trace_dir), terminate_on_solve=True)
    try:
        e.reset()
        _, r, term, trunc, info = e.step({"tool": "check", "source": load_task(TASK).reference_source()})
        assert term and r >= 0.5 and info["judge_result"]["mode"] == "full"
    finally:
        e.close()


def test_text_action_with_fenced_code(env):
    env.reset()
    src = load_task(TASK).reference_source()
    _, _, _, _, info = env.step(f"Here is my ring.\n```python\n{src}```\ntool: check")
    assert info["verdict"] == "pass"


def test_close_is_idempotent(trace_dir):
    e = CommBenchEnv(task=TASK, max_turns=2, world_size=2, trace_dir=str(trace_dir))
    e.reset()
    e.close()
    e.close()
    with pytest.raises(gymnasium.error.ResetNeeded):
        e.reset()


def test_trace_written_every_step_and_replays(trace_dir):
    e = CommBenchEnv(task=TASK, max_turns=4, world_size=2, trace_dir=str(trace_dir))
    agent = load_agent("reference")
    try:
        first = play_episode(e, agent)
    finally:
        e.close()
    trace = read_trace(first.trace_path)
    assert trace.complete and [s.turn for s in trace.steps] == [1, 2, 3]
    assert trace.start.task_hash == load_task(TASK).hash and trace.start.hardware["cpu_count"] > 0
    assert trace.steps[1].action.files["solution.py"] == load_task(TASK).reference_source()
    recorded = [s.verdict for s in trace.steps]
    assert recorded == ["runtime_error", "pass", "pass"]
    assert "turn 3: submit" in format_trace(trace)

    replay = load_agent(AgentCard(name="replay", kind="replay", params={"trace": first.trace_path}))
    e2 = CommBenchEnv(task=TASK, max_turns=4, world_size=2, trace_dir=str(trace_dir))
    try:
        again = play_episode(e2, replay)
    finally:
        e2.close()
    replayed = [s.verdict for s in read_trace(again.trace_path).steps]
    assert replayed == recorded


def test_trace_survives_a_crash_mid_episode(trace_dir):
    e = CommBenchEnv(task=TASK, max_turns=4, world_size=2, trace_dir=str(trace_dir))
    e.reset()
    e.step({"tool": "compile", "source": load_task(TASK).reference_source()})
    path = e.trace_path
    # no close(): as if the process died here
    trace = read_trace(path)
    assert len(trace.steps) == 1 and not trace.complete
    with open(path, "a") as fh:
        fh.write('{"type": "step", "tur')  # a torn last line
    assert len(read_trace(path).steps) == 1
    e.close()


def test_replay_cli_reports_matching_verdicts(trace_dir):
    import subprocess
    import sys

    e = CommBenchEnv(task="p2p/ring_shift", max_turns=4, world_size=2, trace_dir=str(trace_dir))
    try:
        path = play_episode(e, load_agent("reference")).trace_path
    finally:
        e.close()
    out = subprocess.run([sys.executable, "-m", "commbench_env.cli", "replay", path, "--tolerance", "10"],
                         capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("yes") == 3 and "runtime_error" in out.stdout
    one = subprocess.run([sys.executable, "-m", "commbench_env.cli", "replay", path, "--turn", "2"],
                         capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "COLUMNS": "200"})
    assert one.returncode == 0 and one.stdout.count("yes") == 1


def test_a_gpu_profile_on_a_host_without_gpus_is_refused_before_anything_runs(trace_dir):
    import torch

    from commbench_env.errors import UnservableError

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = CommBenchEnv(task="utility/allgather_varlen", sandbox="local-gpu-shared", world_size=2,
                       trace_dir=str(trace_dir))
    try:
        with pytest.raises(UnservableError, match="local-gpu-shared' sees 0"):
            env.reset()
    finally:
        env.close()
    assert not list(trace_dir.glob("*.jsonl"))  # no episode was started


def test_reference_figures_are_kept_apart_by_sandbox_limits():
    from commbench_env.score.reference import limits_key
    from commbench_env.sandbox import load_profile

    cpu = load_profile("local-cpu")
    assert limits_key(cpu) == limits_key(load_profile("local-cpu"))
    assert limits_key(cpu) != limits_key(cpu.model_copy(update={"threads_per_rank": 7}))
    docker = load_profile("docker-cpu")
    assert limits_key(docker) != limits_key(docker.model_copy(update={
        "docker": docker.docker.model_copy(update={"cpus": 1.5})}))
