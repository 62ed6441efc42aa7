"""Evaluate two agent cards on a task subset and print the comparison (the leaderboard metrics).

    python examples/evaluate_models.py                                   # two built-in agents, no API key
    python examples/evaluate_models.py --agents openai-gpt,anthropic-claude --tasks smoke --samples 3

LLM cards read their keys from the environment (OPENAI_API_KEY, ANTHROPIC_API_KEY); a local OpenAI-compatible
server (vLLM, SGLang) works with the local-openai-compatible card. Runs resume: re-running skips finished episodes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from commbench_env.cards import select_tasks
from commbench_env.run.evaluation import run_eval
from commbench_env.run.report import build_report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default="reference,reference-submit")
    ap.add_argument("--tasks", default="p2p/ring_shift,collective/allreduce_ring")
    ap.add_argument("--sandbox", default="local-cpu")
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--out", default="runs/compare")
    a = ap.parse_args()
    tasks = select_tasks(a.tasks)
    dirs = []
    for agent in a.agents.split(","):
        out = Path(a.out) / agent
        print(f"== {agent}: {len(tasks)} task(s) x {a.samples} sample(s) -> {out}")
        run_eval(agent, tasks, sandbox=a.sandbox, out=out, parallel=a.parallel, samples=a.samples, world=a.world,
                 on_event=lambda kind, d: print(f"   {d['key']}: {d.get('verdict') or d['status']}, reward "
                                                f"{d.get('reward', 0.0):.3f}") if kind == "done" else None)
        dirs.append(out)
    metrics, md, pngs = build_report(dirs, Path(a.out) / "report")
    print()
    print(md.read_text())
    print("plots:", ", ".join(str(p) for p in pngs))


if __name__ == "__main__":
    main()
