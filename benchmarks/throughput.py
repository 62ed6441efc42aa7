"""Episodes per minute on the CPU smoke set with 1, 2 and 4 episodes in flight, for three ways of running them:

- `commbench eval` (evaluation.run_eval, threads): every episode makes its own env, so its own sandbox and judge
  server (a fresh interpreter importing torch) -- the non-pooled way;
- EpisodePool + SandboxPool (run/rollouts.py, sandbox/pool.py): asyncio episodes borrowing warm sandboxes, reset between
  episodes;
- Ray (ray_backend.run_episodes_ray on a one-node Ray instance on loopback), when commbench_env.run.ray_backend and ray
  are importable; otherwise the column says "not installed".

Each cell plays the same episodes (the `reference` agent: check the starter, check the reference, submit it) from
a cold start (sandboxes and Ray workers are started inside the timing; Ray's own start is not), after one warm-up
that caches the reference figures, so every column times the same judge work.

    python benchmarks/throughput.py [--repeats 2] [--concurrency 1,2,4] [--sandbox local-cpu] [--tasks smoke]

On a GPU machine, `cuda-shared` tasks (every rank on one GPU), one per category:

    python benchmarks/throughput.py --sandbox local-gpu-shared --tasks gpu-smoke

Tasks that cannot run in the sandbox's device mode are left out, and the table says which ran.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

import commbench_env  # noqa: F401
from commbench_env.agents import load_agent
from commbench_env.cards import load_task, select_tasks
from commbench_env.run.evaluation import run_eval
from commbench_env.judge.host.client import JudgeClient
from commbench_env.sandbox.pool import SandboxPool
from commbench_env.score.reference import reference_figures
from commbench_env.run.rollouts import EpisodePool, EpisodeRequest
from commbench_env.sandbox import load_profile, open_sandbox

AGENT = "reference"
MAX_TURNS = 3
# one CUDA task per category: all run in cuda-shared, so a single-GPU machine can play them
GPU_SMOKE = "p2p/ipc_push_copy,collective/allreduce_twoshot,ep/dispatch_cuda,fusion/allreduce_residual_rmsnorm," \
            "utility/flag_barrier"


class Cell:
    def __init__(self, episodes: int = 0, seconds: float = 0.0, note: str = ""):
        self.episodes, self.seconds, self.note = episodes, seconds, note

    def __str__(self) -> str:
        if self.note:
            return self.note
        return f"{60 * self.episodes / self.seconds:.1f}/min ({self.episodes} in {self.seconds:.1f} s)"


def warm_reference_cache(sandbox: str, tasks: list[str]) -> None:
    sb = open_sandbox(sandbox)
    sb.start()
    client = JudgeClient(sb)
    try:
        for tid in tasks:
            task = load_task(tid)
            reference_figures(client, task, task.world_for(None))
    finally:
        client.close()
        sb.close()


def timed(fn: Callable[[], int]) -> Cell:
    t0 = time.perf_counter()
    n = fn()
    return Cell(n, time.perf_counter() - t0)


def run_eval_cell(sandbox: str, tasks: list[str], repeats: int, concurrency: int) -> Cell:
    with tempfile.TemporaryDirectory() as out:
        def go() -> int:
            recs = run_eval(AGENT, [load_task(t) for t in tasks], sandbox=sandbox, out=Path(out), parallel=concurrency,
                            samples=repeats)
            bad = [r for r in recs if r.get("status") != "done" or r.get("verdict") != "pass"]
            if bad:
                raise RuntimeError(f"episodes failed: {bad[:2]}")
            return len(recs)

        return timed(go)


def pool_cell(sandbox: str, tasks: list[str], repeats: int, concurrency: int) -> tuple[Cell, str]:
    with tempfile.TemporaryDirectory() as out:
        requests = [EpisodeRequest(t, seed=s) for s in range(repeats) for t in tasks]
        stats = ""

        def go() -> int:
            nonlocal stats
            with SandboxPool(sandbox, max_sandboxes=concurrency) as pool:
                async def main():
                    async with EpisodePool(lambda req: load_agent(AGENT), concurrency=concurrency, sandbox_pool=pool,
                                           env_kwargs={"max_turns": MAX_TURNS, "trace_dir": out}) as episodes:
                        return await episodes.run(requests)

                outcomes = asyncio.run(main())
                s = pool.stats()
                stats = f"{s.started} sandbox(es), utilisation {s.utilisation:.0%}, recycles {s.recycles}"
            bad = [o for o in outcomes if not o.ok or o.verdict != "pass"]
            if bad:
                raise RuntimeError(f"episodes failed: {bad[:2]}")
            return len(outcomes)

        return timed(go), stats


def ray_runner() -> tuple[Callable[[str, list[str], int, int], Cell] | None, str]:
    """The Ray column's runner, or why there is none. The hook: commbench_env.run.ray_backend.run_episodes_ray(jobs, *,
    trace_dir, options) with EpisodeJob and RayOptions from the same module."""
    try:
        import ray  # noqa: F401

        from commbench_env.run import ray_backend
    except ImportError:
        return None, "not installed"
    run = getattr(ray_backend, "run_episodes_ray", None)
    if run is None or "trace_dir" not in inspect.signature(run).parameters:
        return None, "not installed (no run_episodes_ray(jobs, trace_dir=...))"
    ray_backend.init_local_ray(num_cpus=2)

    def cell(sandbox: str, tasks: list[str], repeats: int, concurrency: int) -> Cell:
        jobs = [ray_backend.EpisodeJob(task_id=t, sample=s, agent=AGENT, sandbox=sandbox, max_turns=MAX_TURNS)
                for s in range(repeats) for t in tasks]
        # every episode asks for 2/c of this machine's two CPUs, so c fit at once
        opts = ray_backend.RayOptions(max_in_flight=concurrency, cpus_per_episode=2 / concurrency)
        with tempfile.TemporaryDirectory() as out:
            def go() -> int:
                recs = run(jobs, trace_dir=Path(out), options=opts)
                bad = [r for r in recs if r.get("status") != "done" or r.get("verdict") != "pass"]
                if bad:
                    raise RuntimeError(f"episodes failed: {bad[:2]}")
                return len(recs)

            return timed(go)

    return cell, ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2, help="episodes per smoke task in each cell")
    ap.add_argument("--concurrency", default="1,2,4")
    ap.add_argument("--sandbox", default="local-cpu")
    ap.add_argument("--tasks", default="smoke", help="task selector, or gpu-smoke (one CUDA task per category)")
    a = ap.parse_args()
    console = Console(width=None if Console().is_terminal else 150)
    mode = load_profile(a.sandbox).device_mode
    selector = GPU_SMOKE if a.tasks == "gpu-smoke" else a.tasks
    wanted = select_tasks(selector)
    tasks = [t.id for t in select_tasks(selector, device_mode=mode)]
    if not tasks:
        raise SystemExit(f"none of the tasks {a.tasks!r} runs in {a.sandbox}'s device mode {mode}: pick others "
                         "(commbench tasks --device-mode ...)")
    if len(tasks) < len(wanted):
        console.print(f"left out (not in device mode {mode}): {sorted({t.id for t in wanted} - set(tasks))}")
    levels = [int(x) for x in a.concurrency.split(",")]
    console.print(f"warming the reference cache for {len(tasks)} tasks ...")
    t0 = time.perf_counter()
    warm_reference_cache(a.sandbox, tasks)
    console.print(f"reference cache warm in {time.perf_counter() - t0:.0f} s")
    ray_cell, ray_note = ray_runner()
    table = Table(title=f"Episodes per minute: {', '.join(tasks)} (x {a.repeats}), agent '{AGENT}', "
                        f"sandbox {a.sandbox}")
    for col in ("in flight", "commbench eval (env per episode)", "EpisodePool + SandboxPool", "pool figures",
                "Ray (run_episodes_ray)"):
        table.add_column(col, justify="right")
    try:
        for c in levels:
            console.print(f"concurrency {c} ...")
            base = run_eval_cell(a.sandbox, tasks, a.repeats, c)
            pooled, stats = pool_cell(a.sandbox, tasks, a.repeats, c)
            if ray_cell is None:
                ray = Cell(note=ray_note)
            else:
                try:
                    ray = ray_cell(a.sandbox, tasks, a.repeats, c)
                except Exception as exc:  # noqa: BLE001 - the column reports it; the others stand
                    ray = Cell(note=f"error: {type(exc).__name__}: {str(exc)[:80]}")
            table.add_row(str(c), str(base), str(pooled), stats, str(ray))
            # each row as soon as it is measured, so a run cut short still reports what it finished
            console.print(f"  {c} in flight: env per episode {base} | pool {pooled} ({stats}) | Ray {ray}")
    finally:
        if ray_cell is not None:
            import ray as ray_mod

            ray_mod.shutdown()
    console.print(table)


if __name__ == "__main__":
    main()
