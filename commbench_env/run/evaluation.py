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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..agents import AgentCard, load_agent_card
from ..cards import Task
from ..errors import CardError, CommBenchError
from .eval_episode import EpisodeKey, StopSignal, interrupted_record, play_eval_episode
from ..sandbox import load_profile
from ..trace.records import read_trace

if TYPE_CHECKING:
    from .ray_backend import RayOptions

RESULTS = "results.jsonl"


def ledger(out: Path) -> list[dict[str, Any]]:
    """The records of a run's results.jsonl, in order (a torn last line from a crash is ignored)."""
    path = out / RESULTS
    records = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def finished_keys(out: Path) -> set[str]:
    """Episodes already in results.jsonl."""
    return {rec["key"] for rec in ledger(out) if rec.get("status") == "done"}


def _gpu_budget(profile_name: str, world: int, parallel: int) -> int:
    prof = load_profile(profile_name)
    if prof.device_mode != "cuda":
        return parallel
    from ..sandbox.gpus import host_gpu_ids

    gpus = len(prof.gpus.ids) or prof.gpus.count or len(host_gpu_ids())
    return max(1, min(parallel, gpus // max(1, world)))


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
    recorded: set[str] = set()

    def record(rec: dict[str, Any]) -> None:
        with lock:
            with open(out / RESULTS, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
            records.append(rec)
            recorded.add(rec["key"])
        emit("done", rec)

    if backend == "ray":
        from .ray_backend import EpisodeJob, run_episodes_ray

        jobs = [EpisodeJob(task_id=t.id, sample=k.sample, agent=card, sandbox=sandbox, world=world, max_turns=max_turns,
                           agent_params=dict(agent_params or {}), infra_retries=infra_retries, task_hash=t.hash)
                for t, k in todo]
        run_episodes_ray(jobs, trace_dir=out / "traces", options=ray_options, on_result=record,
                         on_start=lambda job: emit("start", {"key": job.key, "attempt": 1}))
        return records

    workers = _gpu_budget(sandbox, max((t.world_for(world) for t in tasks), default=1), parallel)
    stop = StopSignal()
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="episode")
    futures = {pool.submit(play_eval_episode, t, k, card, sandbox=sandbox, trace_dir=out / "traces", world=world,
                           max_turns=max_turns, infra_retries=infra_retries, agent_params=agent_params,
                           emit=emit, stop=stop): (t, k) for t, k in todo}
    try:
        for fut in as_completed(futures):
            record(fut.result())
    except BaseException as exc:  # Ctrl-C, SIGTERM (the CLI raises KeyboardInterrupt), or a card/agent problem
        _stop_run(pool, futures, stop, record, recorded, emit, exc)
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return records


STOP_GRACE_S = 12.0  # how long a stopping run waits for its playing episodes to notice and write their records


def _stop_run(pool: ThreadPoolExecutor, futures: dict, stop: StopSignal, record: Callable[[dict[str, Any]], None],
              recorded: set[str], emit: Callable[[str, dict[str, Any]], None], why: BaseException) -> None:
    """Cancel the queued episodes, stop the playing ones (their sandboxes closed) and write what each came to:
    finished ones as done, the rest as interrupted; a later run with the same command plays only those."""
    emit("stopping", {"why": type(why).__name__})
    pool.shutdown(wait=False, cancel_futures=True)
    stop.set()
    t_stop = time.monotonic()
    deadline = t_stop + STOP_GRACE_S
    for fut, (task, key) in futures.items():
        if fut.cancelled() or str(key) in recorded:
            continue
        try:
            rec = fut.result(timeout=max(0.0, deadline - time.monotonic()))
        except BaseException as exc:  # noqa: BLE001 - still running past the grace, or failed while stopping
            rec = interrupted_record(task, key, t_stop, f"stopped ({type(exc).__name__})")
        record(rec)


def unscored_episodes(run_dir: Path) -> dict[str, int]:
    """Episodes of a run that never finished, by why (`infra_error`, `interrupted`): counted apart, never scored."""
    last: dict[str, str] = {}
    for rec in ledger(run_dir):
        if "key" not in rec or "status" not in rec:  # `commbench run` writes summaries, not an eval ledger
            continue
        if rec.get("status") == "done" or last.get(rec.get("key")) != "done":
            last[rec.get("key")] = rec.get("status", "?")
    out: dict[str, int] = {}
    for status in last.values():
        if status != "done":
            out[status] = out.get(status, 0) + 1
    return out


def load_run_traces(run_dir: Path) -> list[Any]:
    """The traces a run's report counts: one per (task, sample), the one results.jsonl names for a finished
    episode (an episode interrupted and played again on resume leaves two traces; only the finished one counts).
    A folder without an eval ledger (`commbench run` writes summaries, not keys) counts every trace of an episode
    that ended."""
    traces_dir = run_dir / "traces"
    if not traces_dir.is_dir():
        return []
    records = ledger(run_dir)
    if any("key" in rec and "status" in rec for rec in records):  # an eval run's ledger (`commbench run`'s is not)
        chosen = {rec["key"]: traces_dir / Path(rec["trace_path"]).name for rec in records
                  if rec.get("status") == "done" and rec.get("trace_path")}
        paths = sorted(chosen.values())
    else:
        paths = sorted(traces_dir.glob("*.jsonl"))
    traces = []
    for p in paths:
        try:
            t = read_trace(p)
        except (OSError, ValueError):
            continue
        if t.end is not None and t.end.status == "finished":
            traces.append(t)
    return traces
