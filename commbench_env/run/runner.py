"""Play episodes: one agent, a list of tasks, one sandbox; summaries for tables and reports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..agents import Agent, AgentCard, load_agent, load_agent_card
from ..cards import Task
from ..episode.gym_env import CommBenchEnv
from ..episode.play import play
from ..score.reward import RewardConfig


@dataclass
class EpisodeSummary:
    task_id: str
    agent: str
    world_size: int
    turns: int
    reward: float
    verdict: str | None
    correct: bool
    speedup: float | None
    band: str | None
    busbw_gbps: float | None
    size_bytes: int | None
    trace_path: str
    duration_s: float
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def play_episode(env: CommBenchEnv, agent: Agent, *, options: dict[str, Any] | None = None, seed: int | None = None,
                 on_turn: Callable[[int, dict[str, Any]], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> EpisodeSummary:
    """Play one episode to its end (the episode core's loop, `episode.play`); `should_stop()` is asked before every
    agent call and judge run, and a True ends the episode as interrupted (`Interrupted`, its trace marked so)."""
    played = play(env, agent, seed=seed, options=options, should_stop=should_stop, on_turn=on_turn)
    outcome = played.last
    parts = outcome.parts
    bench = outcome.result.benchmark if outcome.result else []
    return EpisodeSummary(task_id=env.task.id, agent=agent.name, world_size=env.world_size, turns=outcome.turn,
                          reward=float(outcome.episode_reward), verdict=outcome.verdict, correct=outcome.correct,
                          speedup=parts.speedup if parts else None, band=parts.band if parts else None,
                          busbw_gbps=bench[-1].scored_busbw_gbps if bench else None,
                          size_bytes=bench[-1].size_bytes if bench else None,
                          trace_path=str(env.trace_path), duration_s=played.ended - played.started)


def run_tasks(tasks: list[Task], agent_card: AgentCard | str, *, sandbox: str = "local-cpu", world: int | None = None,
              max_turns: int | None = None, out_dir: Path | None = None, reward: RewardConfig | None = None,
              on_episode_start: Callable[[Task], None] | None = None,
              on_turn: Callable[[int, dict[str, Any]], None] | None = None,
              on_episode_end: Callable[[EpisodeSummary], None] | None = None) -> list[EpisodeSummary]:
    """Play one episode per task with one env (one sandbox, one warm judge) for the whole list."""
    card = agent_card if isinstance(agent_card, AgentCard) else load_agent_card(agent_card)
    turns = max_turns or card.max_turns or 8
    out: list[EpisodeSummary] = []
    if not tasks:
        return out
    env = CommBenchEnv(task=tasks[0], sandbox=sandbox, max_turns=turns, world_size=tasks[0].world_for(world),
                       reward=reward, agent=card.model_dump(),
                       trace_dir=str(out_dir / "traces") if out_dir else None)
    agent = load_agent(card)
    try:
        for task in tasks:
            if on_episode_start:
                on_episode_start(task)
            summary = play_episode(env, agent, options={"task": task.id, "world_size": task.world_for(world)},
                                   on_turn=on_turn)
            out.append(summary)
            if on_episode_end:
                on_episode_end(summary)
    finally:
        agent.close()
        env.close()
    return out
