"""One (task, sample) episode of an evaluation run, as the thread pool (evaluation.py) and the Ray workers
(ray_backend.py) both play it: retried on infrastructure failures, stoppable, one results.jsonl record out."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..agents import AgentCard, load_agent
from ..cards import Task
from ..episode.gym_env import CommBenchEnv
from ..errors import Interrupted, SandboxError
from ..sandbox import SandboxProfile
from .infra import InfraPolicy
from .runner import play_episode


@dataclass(frozen=True)
class EpisodeKey:
    task_id: str
    sample: int

    def __str__(self) -> str:
        return f"{self.task_id}#{self.sample}"



class StopSignal:
    """Asked to stop: a run's episodes check it between turns, and the envs playing now are closed, so their
    sandboxes go (containers removed) and a judge run in flight fails fast instead of finishing."""

    def __init__(self) -> None:
        self._set = threading.Event()
        self._lock = threading.Lock()
        self._envs: set[CommBenchEnv] = set()

    def __call__(self) -> bool:
        return self._set.is_set()

    def set(self) -> None:
        self._set.set()
        with self._lock:
            envs = list(self._envs)
        for env in envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - stopping goes on whatever one env says
                pass

    def watch(self, env: CommBenchEnv) -> None:
        with self._lock:
            self._envs.add(env)
        if self():
            env.close()

    def forget(self, env: CommBenchEnv) -> None:
        with self._lock:
            self._envs.discard(env)


def interrupted_record(task: Task, key: EpisodeKey, t0: float, why: str = "") -> dict[str, Any]:
    return {"key": str(key), "status": "interrupted", "task_id": task.id, "sample": key.sample,
            "error": why or "the run was stopped", "duration_s": time.monotonic() - t0}


def play_eval_episode(task: Task, key: EpisodeKey, card: AgentCard, *, sandbox: str | SandboxProfile, trace_dir: Path,
                      world: int | None = None, max_turns: int | None = None, infra_retries: int = 2,
                      agent_params: dict[str, Any] | None = None,
                      emit: Callable[[str, dict[str, Any]], None] | None = None,
                      stop: StopSignal | None = None) -> dict[str, Any]:
    """Play one (task, sample) episode of an evaluation run; returns its line of results.jsonl.

    Infrastructure failures (SandboxError) are retried with a fresh env and sandbox, and their partial traces
    removed; after `infra_retries` retries the record says `infra_error` and is never scored. A run being stopped
    (`stop`) ends the episode as `interrupted`. The local thread pool and the Ray backend (`ray_backend.py`) both
    play episodes through this function.
    """
    emit = emit or (lambda kind, data: None)
    stop = stop or StopSignal()
    policy, attempts, last_error = InfraPolicy(infra_retries), 0, ""
    t0 = time.monotonic()
    for attempts in policy.attempts():
        if stop():
            return interrupted_record(task, key, t0)
        env = CommBenchEnv(task=task, sandbox=sandbox, max_turns=max_turns or card.max_turns or 8,
                           world_size=task.world_for(world), agent=card.model_dump(), trace_dir=str(trace_dir))
        player = load_agent(card, **(agent_params or {}))
        stop.watch(env)
        try:
            emit("start", {"key": str(key), "attempt": attempts})
            summary = play_episode(env, player, should_stop=stop,
                                   on_turn=lambda n, info: emit("turn", {"key": str(key), "turn": n,
                                                                         "verdict": info.get("verdict")}))
            return {"key": str(key), "status": "done", "sample": key.sample, "attempts": attempts,
                    **summary.as_dict(), "duration_s": time.monotonic() - t0}
        except Interrupted as exc:
            return interrupted_record(task, key, t0, str(exc))
        except SandboxError as exc:  # infrastructure, not the agent: try again with a fresh sandbox
            if stop():  # the sandbox was taken away because the run is stopping
                return interrupted_record(task, key, t0)
            last_error = policy.describe(exc)
            policy.discard(env.trace_path)
            emit("infra_error", {"key": str(key), "attempt": attempts, "error": last_error})
        finally:
            stop.forget(env)
            player.close()
            env.close()
    return {"key": str(key), "status": "infra_error", "task_id": task.id, "sample": key.sample,
            "attempts": attempts, "error": last_error, "duration_s": time.monotonic() - t0}
