"""Leaderboard reports, recomputed from traces alone (so a report can always be regenerated).

Metrics per run: mean reward; pass rate (mean over episodes of full correctness); PASS+Good (correct and at
least on par with the reference: band better or on_par); geometric-mean speedup over passing episodes; Pass x GM;
pass@k with the unbiased estimator of Chen et al. (2021); turns to first pass; tokens and cost per episode;
breakdowns by category, difficulty and language.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

from ..cards import geomean
from .evaluation import load_run_traces, unscored_episodes
from ..trace.records import Trace


@dataclass
class Episode:
    run: str
    task_id: str
    category: str
    difficulty: str
    language: str
    agent: str
    reward: float
    correct: bool
    band: str | None
    speedup: float | None
    turns: int
    first_pass_turn: int | None
    tokens_in: int
    tokens_out: int
    cost_usd: float
    hints: bool = False  # the agent saw the tasks' design hints (EpisodeConfig.hints)


def episode_of(trace: Trace, run: str) -> Episode:
    s, steps, end = trace.start, trace.steps, trace.end
    card = s.task_card
    last = steps[-1].reward_parts if steps else None
    first_pass = next((st.turn for st in steps if st.verdict == "pass" and st.judge_result is not None
                       and st.judge_result.mode in ("check", "full")), None)
    return Episode(run=run, task_id=trace.task_id, category=str(card.get("category", "?")),
                   difficulty=str(card.get("difficulty", "?")), language=str(card.get("language", "?")),
                   agent=str(s.agent.get("name", "?")), reward=end.reward if end else 0.0,
                   correct=bool(last and last.correct), band=last.band if last else None,
                   speedup=last.speedup if last else None, turns=end.turns if end else len(steps),
                   first_pass_turn=first_pass, tokens_in=sum(m.tokens_in for m in trace.meta),
                   tokens_out=sum(m.tokens_out for m in trace.meta), cost_usd=sum(m.cost_usd for m in trace.meta),
                   hints=bool(s.config.get("hints", False)))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with n samples of which c are correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class RunMetrics:
    run: str
    agent: str
    episodes: int
    tasks: int
    mean_reward: float
    pass_rate: float
    pass_good: float
    gm_speedup: float
    pass_x_gm: float
    pass_at: dict[int, float] = field(default_factory=dict)
    turns_to_first_pass: float | None = None
    tokens_per_episode: float = 0.0
    cost_per_episode: float = 0.0
    by: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    unscored: dict[str, int] = field(default_factory=dict)  # episodes that never finished, by why (never scored)
    hints: str = "no"  # whether the agent saw design hints: "no", "yes" or "mixed" (not comparable with "no")


def metrics(episodes: list[Episode], run: str) -> RunMetrics:
    if not episodes:
        return RunMetrics(run=run, agent="-", episodes=0, tasks=0, mean_reward=0.0, pass_rate=0.0, pass_good=0.0,
                          gm_speedup=0.0, pass_x_gm=0.0)
    per_task: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        per_task[e.task_id].append(e)
    n_min = min(len(v) for v in per_task.values())
    pass_rate = mean(e.correct for e in episodes)
    speedups = [e.speedup for e in episodes if e.correct and e.speedup]
    gm = geomean(speedups) if speedups else 0.0
    firsts = [e.first_pass_turn for e in episodes if e.first_pass_turn is not None]
    by: dict[str, dict[str, dict[str, float]]] = {}
    for dim in ("category", "difficulty", "language"):
        groups: dict[str, list[Episode]] = defaultdict(list)
        for e in episodes:
            groups[getattr(e, dim)].append(e)
        by[dim] = {g: {"episodes": len(v), "pass_rate": mean(x.correct for x in v),
                       "mean_reward": mean(x.reward for x in v)} for g, v in sorted(groups.items())}
    return RunMetrics(
        run=run, agent=episodes[0].agent, episodes=len(episodes), tasks=len(per_task),
        mean_reward=mean(e.reward for e in episodes), pass_rate=pass_rate,
        pass_good=mean(e.correct and e.band in ("better", "on_par") for e in episodes),
        gm_speedup=gm, pass_x_gm=pass_rate * gm,
        pass_at={k: mean(pass_at_k(len(v), sum(x.correct for x in v), k) for v in per_task.values())
                 for k in range(1, n_min + 1)},
        turns_to_first_pass=mean(firsts) if firsts else None,
        tokens_per_episode=mean(e.tokens_in + e.tokens_out for e in episodes),
        cost_per_episode=mean(e.cost_usd for e in episodes), by=by,
        hints="yes" if all(e.hints for e in episodes) else "mixed" if any(e.hints for e in episodes) else "no")


def load_runs(dirs: list[Path]) -> dict[str, list[Episode]]:
    runs: dict[str, list[Episode]] = {}
    for d in dirs:
        name = d.name
        while name in runs:
            name += "'"
        runs[name] = [episode_of(t, name) for t in load_run_traces(d)]
    return runs


def markdown(all_metrics: list[RunMetrics]) -> str:
    ks = sorted({k for m in all_metrics for k in m.pass_at})
    head = ["run", "agent", "hints", "episodes", "tasks", "mean reward", "pass rate", "PASS+Good", "GM speedup", "Pass x GM",
            *[f"pass@{k}" for k in ks], "turns to first pass", "tokens / episode", "cost / episode (USD)"]
    lines = ["# CommBench-Env report", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in all_metrics:
        row = [m.run, m.agent, m.hints, str(m.episodes), str(m.tasks), f"{m.mean_reward:.3f}", f"{m.pass_rate:.3f}",
               f"{m.pass_good:.3f}", f"{m.gm_speedup:.3f}", f"{m.pass_x_gm:.3f}",
               *[f"{m.pass_at[k]:.3f}" if k in m.pass_at else "-" for k in ks],
               "-" if m.turns_to_first_pass is None else f"{m.turns_to_first_pass:.2f}",
               f"{m.tokens_per_episode:.0f}", f"{m.cost_per_episode:.4f}"]
        lines.append("| " + " | ".join(row) + " |")
    unscored = [m for m in all_metrics if m.unscored]
    if unscored:
        lines += ["", "Not scored (never finished; left out of every figure above, played again on resume): "
                  + "; ".join(f"{m.run}: " + ", ".join(f"{n} {why}" for why, n in sorted(m.unscored.items()))
                              for m in unscored)]
    for dim in ("category", "difficulty", "language"):
        groups = sorted({g for m in all_metrics for g in m.by.get(dim, {})})
        lines += ["", f"## By {dim} (pass rate / mean reward)", "",
                  "| run | " + " | ".join(groups) + " |", "|" + "---|" * (len(groups) + 1)]
        for m in all_metrics:
            cells = [f"{m.by[dim][g]['pass_rate']:.2f} / {m.by[dim][g]['mean_reward']:.2f}" if g in m.by.get(dim, {})
                     else "-" for g in groups]
            lines.append(f"| {m.run} | " + " | ".join(cells) + " |")
    lines += ["", "Definitions: hints = whether the agent saw the tasks' design hints (a run with hints is not "
              "comparable with one without); pass rate = mean over episodes of full correctness (all visible and hidden cases and "
              "every timed output); PASS+Good = correct and within 5 % of the reference or faster; GM speedup = "
              "geometric mean of t_reference / t_candidate over passing episodes; Pass x GM = their product; "
              "pass@k = unbiased estimator over the samples of each task (Chen et al., 2021)."]
    return "\n".join(lines) + "\n"


def plots(runs: dict[str, list[Episode]], all_metrics: list[RunMetrics], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    cats = sorted({g for m in all_metrics for g in m.by.get("category", {})})
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / max(1, len(all_metrics))
    for i, m in enumerate(all_metrics):
        xs = [j + i * width for j in range(len(cats))]
        ax.bar(xs, [m.by["category"].get(c, {}).get("pass_rate", 0.0) for c in cats], width, label=m.run)
    ax.set_xticks([j + width * (len(all_metrics) - 1) / 2 for j in range(len(cats))], cats)
    ax.set_ylabel("pass rate")
    ax.set_ylim(0, 1)
    ax.set_title("Pass rate by category")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "pass_rate_by_category.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, eps in runs.items():
        if not eps:
            continue
        horizon = max(e.turns for e in eps)
        xs = list(range(1, horizon + 1))
        ax.plot(xs, [mean(e.first_pass_turn is not None and e.first_pass_turn <= t for e in eps) for t in xs],
                marker="o", label=f"{name}: passed by turn")
        ax.plot(xs, [mean(e.reward for e in eps if e.turns <= t) if any(e.turns <= t for e in eps) else float("nan")
                     for t in xs], linestyle="--", marker="x", label=f"{name}: mean reward of episodes ended by turn")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("turn")
    ax.set_ylim(0, 1.05)
    ax.set_title("Progress by turn")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "progress_by_turn.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def build_report(dirs: list[Path], out: Path) -> tuple[list[RunMetrics], Path, list[Path]]:
    runs = load_runs(dirs)
    all_metrics = [metrics(eps, name) for name, eps in runs.items()]
    for m, d in zip(all_metrics, dirs):
        m.unscored = unscored_episodes(d)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "report.md"
    md.write_text(markdown(all_metrics))
    return all_metrics, md, plots(runs, all_metrics, out)


def as_rows(m: RunMetrics) -> dict[str, Any]:
    return {"run": m.run, "agent": m.agent, "hints": m.hints, "episodes": m.episodes, "mean_reward": m.mean_reward,
            "pass_rate": m.pass_rate, "pass_good": m.pass_good, "gm_speedup": m.gm_speedup, "pass_x_gm": m.pass_x_gm,
            **{f"pass@{k}": v for k, v in m.pass_at.items()}, "unscored": dict(m.unscored)}
