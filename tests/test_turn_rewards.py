"""Per-turn reward schedules: final only (the default), improvement deltas (previous / best so far), discounted
credit; the schedule arithmetic, then real three-turn episodes (starter fails, reference passes, submit)."""

from __future__ import annotations

import pytest

from commbench_env.agents import load_agent
from commbench_env.episode.gym_env import CommBenchEnv
from commbench_env.sandbox.pool import SandboxPool
from commbench_env.score.reward import TurnCredit, TurnRewardConfig
from commbench_env.run.runner import play_episode
from commbench_env.trace.records import read_trace

TASK = "p2p/ring_shift"


def run(cfg: dict, scores: list[float | None], final: float) -> TurnCredit:
    credit = TurnCredit(TurnRewardConfig(**cfg))
    for s in scores:
        credit.step(s)
    credit.step(None, final)
    return credit


def test_schedules():
    final = run({}, [0.0, 0.5], 0.9)
    assert final.rewards == [0.0, 0.0, 0.9] and final.turn_rewards() == final.rewards
    prev = run({"mode": "improvement"}, [0.2, None, 0.5], 0.9)  # None: a turn that judged nothing keeps its score
    assert prev.rewards == pytest.approx([0.2, 0.0, 0.3, 0.4]) and sum(prev.rewards) == pytest.approx(0.9)
    best = run({"mode": "improvement", "baseline": "best"}, [0.5, 0.0], 0.9)
    assert best.rewards == pytest.approx([0.5, -0.5, 0.4])  # the regression, and the last turn, against the best
    unscored = run({"mode": "improvement"}, [0.5], 0.0)  # the episode ends unscored: the gains are taken back
    assert sum(unscored.rewards) == 0.0
    disc = run({"mode": "discounted", "gamma": 0.5}, [0.0, 0.5], 0.8)
    assert disc.rewards == [0.0, 0.0, 0.8] and disc.turn_rewards() == pytest.approx([0.2, 0.4, 0.8])
    with pytest.raises(ValueError):
        TurnRewardConfig(mode="sometimes")


@pytest.fixture(scope="module")
def pool():
    p = SandboxPool("local-cpu", max_sandboxes=1)  # one warm sandbox for every episode of this module
    yield p
    p.close()


def episode(pool, trace_dir, **options):
    """The reference agent's plan: check the starter (fails), check the reference (passes), submit it."""
    env = CommBenchEnv(task=TASK, world_size=2, max_turns=4, sandbox_pool=pool, trace_dir=str(trace_dir), **options)
    rewards, infos = [], []
    agent = load_agent("reference")
    try:
        obs, info = env.reset(seed=0)
        agent.reset(obs, info)
        done = False
        while not done:
            obs, r, term, trunc, info = env.step(agent.act(obs, info))
            rewards.append(r)
            infos.append(info)
            done = term or trunc
    finally:
        env.close()
    return rewards, infos


def test_default_is_the_final_reward_on_the_last_turn(pool, trace_dir):
    rewards, infos = episode(pool, trace_dir)
    final = infos[-1]["final_reward"]
    assert rewards == [0.0, 0.0, final] and final > 0.5  # correct, and timed against the reference
    assert [i["turn_score"] for i in infos] == [0.0, 0.5, final]
    end = read_trace(infos[-1]["trace_path"]).end
    assert end.reward == end.episode_return == final and end.turn_rewards == rewards


def test_improvement_deltas_sum_to_the_final_reward(pool, trace_dir):
    rewards, infos = episode(pool, trace_dir, turn_reward={"mode": "improvement"})
    final = infos[-1]["final_reward"]
    assert rewards == pytest.approx([0.0, 0.5, final - 0.5]) and sum(rewards) == pytest.approx(final)
    end = read_trace(infos[-1]["trace_path"]).end
    assert end.reward == final and end.episode_return == pytest.approx(final)
    # the runner and reports read the final reward, not the last step's delta
    env = CommBenchEnv(task=TASK, world_size=2, max_turns=4, sandbox_pool=pool, trace_dir=str(trace_dir),
                       turn_reward={"mode": "improvement"})
    try:
        summary = play_episode(env, load_agent("reference"))
    finally:
        env.close()
    assert summary.reward > 0.5 and summary.reward == read_trace(summary.trace_path).end.reward


def test_improvement_against_the_best_so_far(pool, trace_dir):
    plan = ["check:reference", "check:starter", "submit:reference"]
    env = CommBenchEnv(task=TASK, world_size=2, max_turns=4, sandbox_pool=pool, trace_dir=str(trace_dir),
                       turn_reward={"mode": "improvement", "baseline": "best"})
    agent = load_agent("reference", plan=plan)
    rewards = []
    try:
        obs, info = env.reset()
        agent.reset(obs, info)
        for _ in plan:
            obs, r, term, _, info = env.step(agent.act(obs, info))
            rewards.append(r)
    finally:
        env.close()
    assert term and rewards == pytest.approx([0.5, -0.5, info["final_reward"] - 0.5])


def test_discounted_credit_at_the_end(pool, trace_dir):
    rewards, infos = episode(pool, trace_dir, turn_reward={"mode": "discounted", "gamma": 0.5})
    final = infos[-1]["final_reward"]
    assert rewards == [0.0, 0.0, final]
    assert infos[-1]["turn_rewards"] == pytest.approx([0.25 * final, 0.5 * final, final])
    assert "turn_rewards" not in infos[0]
