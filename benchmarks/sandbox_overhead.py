"""Sandbox overhead: median `reset` and `step` (check mode) wall time with the local and the docker backend,
side by side in one run, and their ratios. Targets: docker step <= 1.3x local; docker reset <= local + 1 s.

    python benchmarks/sandbox_overhead.py [--task p2p/ring_shift] [--world 2] [--episodes 5] [--steps 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from rich.console import Console
from rich.table import Table

from commbench_env.cards import load_task
from commbench_env.episode.gym_env import CommBenchEnv


def measure(profile: str, task: str, world: int, episodes: int, steps: int) -> tuple[float, float, float]:
    """(median reset, median first step, median later step) in seconds."""
    source = load_task(task).reference_source()
    resets, firsts, later = [], [], []
    env = CommBenchEnv(task=task, sandbox=profile, world_size=world, max_turns=steps + 1, reference="none",
                       trace_dir=tempfile.mkdtemp())
    try:
        for _ in range(episodes):
            t0 = time.perf_counter()
            env.reset()
            resets.append(time.perf_counter() - t0)
            for i in range(steps):
                t0 = time.perf_counter()
                _, _, _, _, info = env.step({"tool": "check", "source": source})
                assert info["verdict"] == "pass", info.get("judge_result", {}).get("summary")
                (firsts if i == 0 else later).append(time.perf_counter() - t0)
    finally:
        env.close()
    return statistics.median(resets), statistics.median(firsts), statistics.median(later)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="p2p/ring_shift")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--episodes", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    console = Console()
    local = measure("local-cpu", a.task, a.world, a.episodes, a.steps)
    docker = measure("docker-cpu", a.task, a.world, a.episodes, a.steps)
    table = Table(title=f"{a.task}, world {a.world}: medians in seconds ({a.episodes} episodes x {a.steps} steps)")
    for c in ("backend", "reset", "first step (starts the judge server)", "step"):
        table.add_column(c, justify="right")
    table.add_row("local-cpu", *(f"{x:.3f}" for x in local))
    table.add_row("docker-cpu", *(f"{x:.3f}" for x in docker))
    console.print(table)
    console.print(f"docker step / local step = {docker[2] / local[2]:.2f} (target <= 1.3); "
                  f"docker reset - local reset = {docker[0] - local[0]:+.3f} s (target <= 1 s); "
                  f"first step: docker container fresh per episode, local sandbox reused")


if __name__ == "__main__":
    main()
