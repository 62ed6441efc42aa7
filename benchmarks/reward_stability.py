"""Reward stability: the same submission evaluated N times in a row; prints the mean and standard deviation.

The reference figures are measured as the env measures them (commbench_env.score.reference: on a GPU, each size's
median of three runs), then the reference itself is submitted N times and scored against them; a stable judge
gives rewards near 1.0 with a small spread. Rewards are clipped at 1.0, so the spread of the speedup is printed
too: it is the honest figure.

    python benchmarks/reward_stability.py [--task collective/allreduce_ring] [--sandbox local-cpu] [--runs 10]
                                          [--env NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import statistics

from commbench_env.cards import load_task
from commbench_env.errors import JudgeInfraError
from commbench_env.judge.host.client import JudgeClient
from commbench_env.score.reference import reference_figures
from commbench_env.score.reward import compute_reward
from commbench_env.sandbox import load_profile, open_sandbox


def _times(sizes) -> str:
    """Median time per call at each benchmark size (what the reward compares), to show which sizes move; with
    the fastest call, each rank's mean and the calls whose clock ran on to a device sync ("ext"), to tell a slow
    evaluation from slow calls, a late rank and a clock extended for work that outlived the stop event."""
    return ", ".join(f"{s.size_bytes / 2**20:g} MiB {s.time_us_median:.0f} us (min {s.time_us_min:.0f}, ranks "
                     f"{'/'.join(f'{t:.0f}' for t in s.per_rank_mean_us)}, ext {s.extended_calls})" for s in sizes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="collective/allreduce_ring")
    ap.add_argument("--sandbox", default="local-cpu")
    ap.add_argument("--world", type=int, default=None)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="set in the sandbox's environment, e.g. COMMBENCH_TIMING_TRACE=/tmp/trace.jsonl")
    a = ap.parse_args()
    task = load_task(a.task)
    world = a.world or task.card.world.default_size
    files = {task.card.entry.file: task.reference_source()}
    if any("=" not in kv for kv in a.env):
        ap.error(f"--env takes NAME=VALUE, got {[kv for kv in a.env if '=' not in kv]}")
    extra = dict(kv.split("=", 1) for kv in a.env)
    prof = load_profile(a.sandbox).with_env(extra)
    with open_sandbox(prof) as sb:
        client = JudgeClient(sb)
        try:
            ref = reference_figures(client, task, world, refresh=True)
        except JudgeInfraError as exc:
            raise SystemExit(str(exc)) from None
        print(f"reference figures: {_times(ref)}", flush=True)
        rewards, speedups = [], []
        for i in range(a.runs):
            res = client.evaluate(task, files, "full", world)
            parts = compute_reward(res, ref)
            rewards.append(parts.reward)
            speedups.append(parts.speedup or 0.0)
            print(f"run {i + 1:>2}: verdict {res.verdict.value}, speedup {parts.speedup or 0:.3f}, reward {parts.reward:.4f}; "
                  f"{_times(res.benchmark)}; so far reward std {statistics.pstdev(rewards):.4f}, "
                  f"speedup std {statistics.pstdev(speedups):.3f}", flush=True)  # a run cut short still reports
        client.close()
    print(f"\n{a.task} on {a.sandbox} (world {world}), {a.runs} runs: reward mean {statistics.mean(rewards):.4f}, "
          f"std {statistics.pstdev(rewards):.4f} (target <= 0.02); speedup mean {statistics.mean(speedups):.3f}, "
          f"std {statistics.pstdev(speedups):.3f}")


if __name__ == "__main__":
    main()
