"""What the judge's start line (judge/cuda/start_line.cu) changes in `cuda` task timings: the same references
judged with it and without it, alternating (on, off, on, off, ...) so that drift of the machine shows as drift,
not as an effect. Run on a GPU machine.

For each task it prints, per benchmark size, the median time per call (what the reward compares) and each rank's
mean: a rank that started before its peer shows a larger mean than the peer.

    python benchmarks/start_line_ab.py [--tasks p2p/pingpong_flags,...] [--mode cuda] [--world 2] [--rounds 2]
"""

from __future__ import annotations

import argparse

from commbench_env.cards import load_task
from commbench_env.judge.client import JudgeClient
from commbench_env.sandbox import load_profile, open_sandbox

DEFAULT_TASKS = ("p2p/pingpong_flags,utility/flag_barrier,collective/allreduce_oneshot,collective/allreduce_twoshot,"
                 "p2p/ipc_push_copy,p2p/tma_bulk_push")


def judge_all(tasks: list, mode: str, world: int, start_line: bool) -> dict[str, list]:
    """task id -> its benchmark sizes, every reference judged in one fresh sandbox (one judge server)."""
    prof = load_profile("local-gpu")
    prof = prof.model_copy(update={"env": {**prof.env, "COMMBENCH_START_LINE": "1" if start_line else "0"}})
    out = {}
    with open_sandbox(prof) as sb:
        client = JudgeClient(sb)
        for task in tasks:
            res = client.evaluate(task, {task.card.entry.file: task.reference_source()}, "benchmark", world,
                                  device_mode=mode)
            out[task.id] = res.benchmark if res.verdict.value == "pass" else f"{res.verdict.value}: {res.summary}"
        client.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=DEFAULT_TASKS)
    ap.add_argument("--mode", default="cuda")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    tasks = [load_task(t) for t in a.tasks.split(",")]
    runs: list[tuple[bool, dict]] = []
    for rnd in range(a.rounds):
        for on in (True, False):
            runs.append((on, judge_all(tasks, a.mode, a.world, on)))
            print(f"round {rnd + 1}, start line {'on' if on else 'off'}: done", flush=True)
    print(f"\n{a.mode} mode, world {a.world}; per size: median us per call [rank means]")
    for task in tasks:
        print(f"\n{task.id}")
        for on, got in runs:
            sizes = got[task.id]
            if isinstance(sizes, str):
                print(f"  {'on ' if on else 'off'}  {sizes}")
                continue
            cells = [f"{s.size_bytes:>9} B {s.time_us_median:8.1f} [{'/'.join(f'{t:.1f}' for t in s.per_rank_mean_us)}]"
                     for s in sizes]
            print(f"  {'on ' if on else 'off'}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
