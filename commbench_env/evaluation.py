"""Evaluation runs: an agent on many tasks, several samples each, episodes in parallel, resumable.

A run folder holds `run.json` (what was asked), `traces/` (one trace per episode) and `results.jsonl` (one line
per finished episode, appended as episodes finish). Restarting the same command skips finished episodes.
Infrastructure failures (sandbox died, judge could not run) are retried and never scored as the agent's failure.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .agents import AgentCard, load_agent, load_agent_card
from .cards import Task
from .env import CommBenchEnv
from .errors import CardError, CommBenchError, SandboxError
from .runner import pick_world, play_episode
from .sandbox import SandboxProfile, load_profile
from .trace import read_trace

if TYPE_CHECKING:
    from .ray_backend import RayOptions

RESULTS = "results.jsonl"


@dataclass(frozen=True)
class EpisodeKey:
    task_id: str
    sample: int

    def __str__(self) -> str:
        return f"{self.task_id}#{self.sample}"


def finished_keys(out: Path) -> set[str]:
    """Episodes already in results.jsonl (a torn last line from a crash is ignored)."""
    done: set[str] = set()
    path = out / RESULTS
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("status") == "done":
                done.add(rec["key"])
    return done


def _gpu_budget(profile_name: str, world: int, parallel: int) -> int:
    prof = load_profile(profile_name)
    if prof.device_mode != "cuda":
        return parallel
    from .sandbox.gpus import host_gpu_ids

    gpus = len(prof.gpus.ids) or prof.gpus.count or len(host_gpu_ids())
    return max(1, min(parallel, gpus // max(1, world)))


def play_eval_episode(task: Task, key: EpisodeKey, card: AgentCard, *, sandbox: str | SandboxProfile, trace_dir: Path,
                      world: int | None = None, max_turns: int | None = None, infra_retries: int = 2,
                      agent_params: dict[str, Any] | None = None,
                      emit: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Play one (task, sample) episode of an evaluation run; returns its line of results.jsonl.

    Infrastructure failures (SandboxError) are retried with a fresh env and sandbox, and their partial traces
    removed; after `infra_retries` retries the record says `infra_error` and is never scored. The local thread pool
    and the Ray backend (`ray_backend.py`) both play episodes through this function.
    """
    emit = emit or (lambda kind, data: None)
    attempts, last_error = 0, ""
    t0 = time.monotonic()
    while attempts <= infra_retries:
        attempts += 1
        env = CommBenchEnv(task=task, sandbox=sandbox, max_turns=max_turns or card.max_turns or 8,
                           world_size=pick_world(task, world), agent=card.model_dump(), trace_dir=str(trace_dir))
        player = load_agent(card, **(agent_params or {}))
        try:
            emit("start", {"key": str(key), "attempt": attempts})
            summary = play_episode(env, player, on_turn=lambda n, info: emit("turn", {"key": str(key), "turn": n,
                                                                                     "verdict": info.get("verdict")}))
            return {"key": str(key), "status": "done", "sample": key.sample, "attempts": attempts,
                    **summary.as_dict(), "duration_s": time.monotonic() - t0}
        except SandboxError as exc:  # infrastructure, not the agent: try again with a fresh sandbox
            last_error = f"{type(exc).__name__}: {exc}"
            if env.trace_path and env.trace_path.exists():
                env.trace_path.unlink()
            emit("infra_error", {"key": str(key), "attempt": attempts, "error": last_error})
        finally:
            player.close()
            env.close()
    return {"key": str(key), "status": "infra_error", "task_id": task.id, "sample": key.sample,
            "attempts": attempts, "error": last_error, "duration_s": time.monotonic() - t0}


def run_eval(agent: AgentCard | str, tasks: list[Task], *, sandbox: str, out: Path, parallel: int = 1,
             samples: int = 1, world: int | None = None, max_turns: int | None = None, infra_retries: int = 2,
             agent_params: dict[str, Any] | None = None,
             on_event: Callable[[str, dict[str, Any]], None] | None = None, backend: str = "threads",
             ray_options: RayOptions | None = None) -> list[dict[str, Any]]:
    """Play every (task, sample) episode not yet in out/results.jsonl; returns the new result records.

    backend `threads`: `parallel` episodes at once on this host (capped by the sandbox's GPUs). backend `ray`: every
    episode is a Ray task scheduled on a node with the resources it needs (see ray_backend.py; `parallel` is not
    used, `ray_options.max_in_flight` caps episodes in flight); records and traces land here all the same.
    """
    if backend not in ("threads", "ray"):
        raise CommBenchError(f"backend must be 'threads' or 'ray', not {backend!r}")
    card = agent if isinstance(agent, AgentCard) else load_agent_card(agent)
    out.mkdir(parents=True, exist_ok=True)
    (out / "traces").mkdir(exist_ok=True)
    run_info = {"agent": card.model_dump(), "sandbox": sandbox, "tasks": [t.id for t in tasks], "samples": samples,
                "world": world, "max_turns": max_turns or card.max_turns, "backend": backend}
    info_path = out / "run.json"
    if info_path.is_file():
        old = json.loads(info_path.read_text())
        if old.get("agent", {}).get("name") != card.name:
            raise CardError(f"{out} holds a run of agent {old.get('agent', {}).get('name')!r}, not {card.name!r}; "
                            "use another --out folder")
    else:
        info_path.write_text(json.dumps({**run_info, "started": time.time()}, indent=1))
    done = finished_keys(out)
    todo = [(t, EpisodeKey(t.id, s)) for s in range(samples) for t in tasks if str(EpisodeKey(t.id, s)) not in done]
    emit = on_event or (lambda kind, data: None)
    emit("plan", {"total": len(tasks) * samples, "skipped": len(tasks) * samples - len(todo), "todo": len(todo)})
    lock = threading.Lock()
    records: list[dict[str, Any]] = []

    def record(rec: dict[str, Any]) -> None:
        with lock:
            with open(out / RESULTS, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
            records.append(rec)
        emit("done", rec)

    if backend == "ray":
        from .ray_backend import EpisodeJob, run_episodes_ray

        jobs = [EpisodeJob(task_id=t.id, sample=k.sample, agent=card, sandbox=sandbox, world=world, max_turns=max_turns,
                           agent_params=dict(agent_params or {}), infra_retries=infra_retries, task_hash=t.hash)
                for t, k in todo]
        run_episodes_ray(jobs, trace_dir=out / "traces", options=ray_options, on_result=record,
                         on_start=lambda job: emit("start", {"key": job.key, "attempt": 1}))
        return records

    workers = _gpu_budget(sandbox, max((pick_world(t, world) for t in tasks), default=1), parallel)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(play_eval_episode, t, k, card, sandbox=sandbox, trace_dir=out / "traces", world=world,
                               max_turns=max_turns, infra_retries=infra_retries, agent_params=agent_params,
                               emit=emit): k for t, k in todo}
        for fut in as_completed(futures):
            try:
                rec = fut.result()
            except CommBenchError as exc:  # a card or agent problem: stop the run, say what is wrong
                for f in futures:
                    f.cancel()
                raise exc
            record(rec)
    return records


def load_run_traces(run_dir: Path) -> list[Any]:
    """Complete traces of a run folder (the report's only input)."""
    traces = []
    for p in sorted((run_dir / "traces").glob("*.jsonl")) if (run_dir / "traces").is_dir() else []:
        try:
            t = read_trace(p)
        except (OSError, ValueError):
            continue
        if t.complete:
            traces.append(t)
    return traces
