"""Vectorised use: check_env with drawn tasks and seeds, SyncVectorEnv and AsyncVectorEnv (spawned workers, so the
env is pickled and rebuilt in a subprocess) with real judged steps, batching of text spaces, both autoreset modes."""

from __future__ import annotations

import pickle

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

import commbench_env  # noqa: F401 - registers CommBench-v0
from commbench_env.cards import SMOKE_SET, load_task
from commbench_env.episode.gym_env import CommBenchEnv

TASK = "p2p/ring_shift"
REFERENCE = load_task(TASK).reference_source()
WRONG = "import torch\n\n\ndef ring_shift(x):\n    return x.clone()\n"  # no communication: wrong values


def test_check_env_with_tasks_drawn_from_the_seed(trace_dir):
    env = gymnasium.make("CommBench-v0", tasks="smoke", max_turns=2, reference="none",
                         trace_dir=str(trace_dir)).unwrapped  # keeps the registered spec (nondeterministic=True)
    try:
        check_env(env, skip_render_check=True)  # includes: the same seed gives the same first observation
        drawn = []
        for seed in range(12):
            _, info = env.reset(seed=seed)
            drawn.append(info["task_id"])
        assert set(drawn) <= set(SMOKE_SET) and len(set(drawn)) > 1
        assert [env.reset(seed=s)[1]["task_id"] for s in range(12)] == drawn
        assert env.reset(seed=0, options={"task": TASK})[1]["task_id"] == TASK  # options still choose
    finally:
        env.close()


def test_env_pickles_as_its_arguments(trace_dir):
    env = CommBenchEnv(task=TASK, world_size=4, max_turns=3, turn_reward={"mode": "improvement"},
                       trace_dir=str(trace_dir))
    env.reset(seed=0)
    copy = pickle.loads(pickle.dumps(env))
    try:
        assert copy.config == env.config and copy.world_size == 4
        assert copy.observation_space == env.observation_space and copy.action_space == env.action_space
        with pytest.raises(gymnasium.error.ResetNeeded):  # a fresh copy: no episode, no sandbox yet
            copy.step({"tool": "check", "source": REFERENCE})
    finally:
        copy.close()
        env.close()


def make_vec(mode: str, trace_dir, env_kwargs: dict | None = None, **vector_kwargs):
    return gymnasium.make_vec("CommBench-v0", num_envs=2, vectorization_mode=mode, vector_kwargs=vector_kwargs,
                              task=TASK, world_size=2, max_turns=3, reference="none", trace_dir=str(trace_dir),
                              **(env_kwargs or {}))


def play_check_then_submit(envs, pooled: bool = False):
    """Env 0 plays the reference, env 1 a wrong solution: check, then submit. Returns the submit step."""
    obs, info = envs.reset(seed=[7, 8])
    assert ("sandbox" in info) == pooled
    assert isinstance(obs["task"], tuple) and len(obs["task"]) == 2 and "ring_shift" in obs["task"][0]
    assert obs["feedback"] == ("", "") and list(obs["turn"]) == [0, 0]
    assert envs.observation_space.contains(obs)
    obs, reward, term, trunc, info = envs.step({"tool": np.array([1, 1]), "source": (REFERENCE, WRONG)})
    assert list(info["verdict"]) == ["pass", "wrong_answer"] and list(reward) == [0.0, 0.0]
    assert "wrong_answer" in obs["feedback"][1] and "expected" in obs["feedback"][1]
    assert list(obs["turn"]) == [1, 1] and not term.any() and not trunc.any()
    return envs.step({"tool": np.array([4, 4]), "source": ("", "")})  # submit: "" reuses the last code


def test_sync_vector_env_judges_batches_and_autoresets_next_step(trace_dir):
    envs = make_vec("sync", trace_dir)
    try:
        obs, reward, term, trunc, info = play_check_then_submit(envs)
        assert reward[0] > 0 and reward[1] == 0.0
        assert list(term) == [True, True] and not trunc.any()
        assert list(info["final_reward"]) == [reward[0], 0.0]
        assert list(obs["turn"]) == [2, 2]  # the terminal observation; the reset comes with the next step
        obs, reward, term, trunc, info = envs.step({"tool": np.array([1, 1]), "source": ("ignored", "ignored")})
        assert list(obs["turn"]) == [0, 0] and obs["feedback"] == ("", "") and list(reward) == [0.0, 0.0]
        assert not term.any() and envs.observation_space.contains(obs)
    finally:
        envs.close()


def test_async_vector_env_in_spawned_workers_autoresets_same_step(trace_dir):
    # each worker builds its env, with a private one-sandbox pool, from the pickled arguments
    envs = make_vec("async", trace_dir, {"sandbox_pool": {"max_sandboxes": 1}}, shared_memory=False,
                    context="spawn", autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        obs, reward, term, _, info = play_check_then_submit(envs, pooled=True)
        assert reward[0] > 0 and reward[1] == 0.0 and list(term) == [True, True]
        assert list(obs["turn"]) == [0, 0] and obs["feedback"] == ("", "")  # already reset in the same step
        final = info["final_obs"]
        assert [f["turn"] for f in final] == [2, 2] and "Submitted. Reward" in final[0]["feedback"]
        assert info["final_info"]["verdict"][0] == "pass"
    finally:
        envs.close()


def test_async_vector_env_refuses_shared_memory_with_advice(trace_dir):
    with pytest.raises(ValueError, match="shared_memory") as err:
        make_vec("async", trace_dir)
    assert "shared_memory" in str(err.value.__cause__)  # ours: Text in shared memory would be read only once
