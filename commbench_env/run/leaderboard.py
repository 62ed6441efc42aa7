"""The leaderboard file: `commbench report --json`, a machine-readable twin of report.md.

One entry per run with the anchor metrics the Markdown report shows (computed by report.py, never here: the two
cannot disagree), the per-task results behind them, and what makes a row comparable with another: the judge,
timing and link-model versions, the task-set hash (over every task folder used, references included), the sandbox
image digest, the hardware fingerprint and the agent card. Rows whose `comparable_key` differ were not measured
the same way. Everything is recomputed from the traces, like the report.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any

from ..cards import geomean
from ..sandbox.base import HardwareInfo
from ..trace.records import Trace
from .evaluation import load_run_traces
from .report import Episode, RunMetrics, as_rows, episode_of, pass_at_k

LEADERBOARD_SCHEMA = "commbench-leaderboard/1"
# the fields two rows must share to be compared; `comparable_key` hashes them
COMPARABLE = ("judge_version", "judge_source", "result_schema", "timing_version", "comm_model", "image_digest",
              "hardware_fingerprint", "task_set_hash", "sandbox", "device_mode", "world_sizes", "hints")


def task_set_hash(pairs: set[tuple[str, str]]) -> str:
    """A hash over (task id, task hash) pairs; a task's hash covers its whole folder: card, prompt, starter,
    reference. The same tasks at the same contents give the same hash, whatever order they were played in."""
    h = hashlib.sha256()
    for task_id, digest in sorted(pairs):
        h.update(f"{task_id}\0{digest}\n".encode())
    return h.hexdigest()[:16]


def _one(values: list[Any]) -> Any:
    """The value all episodes share, or the sorted distinct values when they differ (a mixed run)."""
    distinct = sorted({json.dumps(v, sort_keys=True) for v in values})
    if len(distinct) == 1:
        return json.loads(distinct[0])
    return [json.loads(v) for v in distinct]


def _versions_of(trace: Trace) -> dict[str, Any]:
    """A trace's recorded versions; for traces written before they were recorded, what the trace still says
    (the judge version of its results, the fingerprint of its hardware)."""
    v = trace.start.versions.model_dump(mode="json")
    if not v["judge_version"]:
        v["judge_version"] = next((s.judge_result.judge_version for s in trace.steps
                                   if s.judge_result is not None and s.judge_result.judge_version), "")
    if not v["result_schema"]:
        v["result_schema"] = next((s.judge_result.schema_version for s in trace.steps if s.judge_result), "")
    if not v["hardware_fingerprint"] and trace.start.hardware:
        try:
            v["hardware_fingerprint"] = HardwareInfo.model_validate(trace.start.hardware).fingerprint
        except ValueError:
            pass
    return v


def _comparability(traces: list[Trace]) -> dict[str, Any]:
    versions = [_versions_of(t) for t in traces]
    out: dict[str, Any] = {k: _one([v[k] for v in versions]) for k in versions[0]} if versions else {}
    out["task_set_hash"] = task_set_hash({(t.task_id, t.start.task_hash) for t in traces})
    out["sandbox"] = _one([t.start.sandbox.get("name", "?") for t in traces])
    out["device_mode"] = _one([t.start.sandbox.get("device_mode", "?") for t in traces])
    out["world_sizes"] = sorted({t.start.world_size for t in traces if t.start.world_size is not None})
    out["hints"] = _one([bool(t.start.config.get("hints", False)) for t in traces])
    finals = [s.judge_result for t in traces for s in t.steps[-1:] if s.judge_result is not None]
    out["leaderboard_grade"] = bool(finals) and all(r.leaderboard_grade for r in finals)
    out["isolation_missing"] = sorted({m for r in finals for m in r.isolation_missing})
    out["mixed"] = sorted(k for k in COMPARABLE if k in out and k != "world_sizes" and isinstance(out[k], list))
    key = json.dumps({k: out.get(k) for k in COMPARABLE}, sort_keys=True)
    out["comparable_key"] = hashlib.sha256(key.encode()).hexdigest()[:16]
    return out


def _task_rows(episodes: list[Episode], hashes: dict[str, set[str]]) -> list[dict[str, Any]]:
    per_task: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        per_task[e.task_id].append(e)
    rows = []
    for task_id, eps in sorted(per_task.items()):
        n, c = len(eps), sum(e.correct for e in eps)
        speedups = [e.speedup for e in eps if e.correct and e.speedup]
        bands: dict[str, int] = defaultdict(int)
        for e in eps:
            bands[e.band or "none"] += 1
        first = eps[0]
        rows.append({"task": task_id, "task_hash": _one(sorted(hashes.get(task_id, set()))),
                     "category": first.category, "difficulty": first.difficulty, "language": first.language,
                     "episodes": n, "passed": c, "pass_rate": c / n, "mean_reward": mean(e.reward for e in eps),
                     "best_reward": max(e.reward for e in eps),
                     "pass_good": mean(e.correct and e.band in ("better", "on_par") for e in eps),
                     "gm_speedup": geomean(speedups) if speedups else 0.0,
                     "pass_at": {str(k): pass_at_k(n, c, k) for k in range(1, n + 1)},
                     "bands": dict(sorted(bands.items())), "mean_turns": mean(e.turns for e in eps),
                     "tokens_per_episode": mean(e.tokens_in + e.tokens_out for e in eps),
                     "cost_per_episode": mean(e.cost_usd for e in eps)})
    return rows


def run_entry(run_dir: Path, m: RunMetrics) -> dict[str, Any]:
    """One run's leaderboard entry: `m` is report.py's metrics of that run (the numbers of report.md)."""
    traces = load_run_traces(run_dir)
    episodes = [episode_of(t, m.run) for t in traces]
    hashes: dict[str, set[str]] = defaultdict(set)
    for t in traces:
        hashes[t.task_id].add(t.start.task_hash)
    metrics = {k: v for k, v in as_rows(m).items() if not k.startswith("pass@") and k not in ("run", "agent", "hints")}
    metrics.update(tasks=m.tasks, pass_at={str(k): v for k, v in sorted(m.pass_at.items())},
                   turns_to_first_pass=m.turns_to_first_pass, tokens_per_episode=m.tokens_per_episode,
                   cost_per_episode=m.cost_per_episode, by=m.by)
    agents = [t.start.agent for t in traces]
    return {"run": m.run, "path": str(run_dir), "agent": m.agent, "hints": m.hints,
            "agent_card": _one(agents) if agents else {}, "metrics": metrics,
            "comparability": _comparability(traces), "tasks": _task_rows(episodes, hashes)}


def leaderboard(dirs: list[Path], all_metrics: list[RunMetrics]) -> dict[str, Any]:
    """The whole file: `dirs` and `all_metrics` in the same order, as report.build_report returns them."""
    from .. import __version__

    return {"schema": LEADERBOARD_SCHEMA, "generator": f"commbench-env {__version__}",
            "definitions": {"pass_rate": "mean over episodes of full correctness (all visible and hidden cases and "
                                         "every timed output)",
                            "pass_good": "correct and within 5 % of the reference or faster (band better or on_par)",
                            "gm_speedup": "geometric mean of t_reference / t_candidate over passing episodes",
                            "pass_x_gm": "pass_rate x gm_speedup",
                            "pass_at": "unbiased pass@k over the samples of each task (Chen et al., 2021), "
                                       "k up to the fewest samples of a task",
                            "comparable_key": "hash of the comparability fields " + ", ".join(COMPARABLE)},
            "runs": [run_entry(d, m) for d, m in zip(dirs, all_metrics)]}


def write_leaderboard(dirs: list[Path], all_metrics: list[RunMetrics], path: Path | None) -> str:
    """Write the file to `path` (None or "-": return the text only, for stdout); returns the JSON text."""
    text = json.dumps(leaderboard(dirs, all_metrics), indent=1) + "\n"
    if path is not None and str(path) != "-":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return text
