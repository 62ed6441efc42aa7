"""What the viewer shows, computed from traces: a sortable, filterable episode index and per-episode pages."""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..records import Trace, read_trace


@dataclass
class EpisodeRow:
    id: str
    run: str
    task: str
    agent: str
    reward: float
    turns: int
    verdict: str
    cost_usd: float
    tokens: int
    complete: bool


def _trace_files(paths: list[Path]) -> list[tuple[str, Path]]:
    out = []
    for p in paths:
        if p.is_file():
            out.append((p.parent.name, p))
        else:
            for f in sorted(p.rglob("*.jsonl")):
                run = f.parent.parent.name if f.parent.name == "traces" else f.parent.name
                out.append((run, f))
    return out


class EpisodeIndex:
    """All episodes under some traces, run folders or folders of runs; pages are built on demand."""

    def __init__(self, paths: list[Path]):
        self.rows: list[EpisodeRow] = []
        self.files: dict[str, Path] = {}
        for run, f in _trace_files(paths):
            try:
                t = read_trace(f)
            except (OSError, ValueError):
                continue
            eid = hashlib.sha1(str(f.resolve()).encode()).hexdigest()[:12]
            end = t.end
            self.rows.append(EpisodeRow(
                id=eid, run=run, task=t.task_id, agent=t.start.agent_name, reward=end.reward if end else 0.0,
                turns=len(t.steps), verdict=(end.final_verdict or end.status) if end else "unfinished",
                cost_usd=sum(m.cost_usd for m in t.meta), tokens=sum(m.tokens_in + m.tokens_out for m in t.meta),
                complete=t.complete))
            self.files[eid] = f

    def page(self, *, offset: int = 0, limit: int = 100, query: str = "", sort: str = "task",
             descending: bool = False) -> dict[str, Any]:
        q = query.lower().strip()
        rows = [r for r in self.rows if not q or q in f"{r.run} {r.task} {r.agent} {r.verdict}".lower()]
        if sort in EpisodeRow.__dataclass_fields__:
            rows.sort(key=lambda r: getattr(r, sort), reverse=descending)
        return {"total": len(rows), "offset": offset, "rows": [asdict(r) for r in rows[offset:offset + limit]]}

    def episode(self, eid: str) -> dict[str, Any] | None:
        f = self.files.get(eid)
        if f is None:
            return None
        return episode_view(read_trace(f))


def episode_view(t: Trace) -> dict[str, Any]:
    """Everything an episode page shows, with each turn's code diffed against the previous turn's."""
    turns, previous = [], ""
    for s in t.steps:
        files = s.action.files
        code = "\n".join(files.values()) if files else previous
        diff = "".join(difflib.unified_diff(previous.splitlines(True), code.splitlines(True), "previous", "this turn"))
        jr = s.judge_result.model_dump(mode="json") if s.judge_result else {}
        bench = jr.get("benchmark") or []
        first_bad = next((c.get("mismatch") for c in jr.get("cases") or [] if c.get("mismatch")), None)
        turns.append({
            "turn": s.turn, "tool": s.action.tool, "message": s.meta.message, "code": code,
            "diff": diff if files else "", "feedback": s.observation, "verdict": jr.get("verdict"),
            "summary": jr.get("summary", ""), "mismatch": first_bad,
            "benchmark": [_bench_row(b) for b in bench],
            "roofline": jr.get("roofline"),
            "profile": [{"rank": p.get("rank"), "rows": (p.get("rows") or [])[:10]} for p in jr.get("profile") or []],
            "reward": s.reward, "reward_parts": s.reward_parts.model_dump(mode="json") if s.reward_parts else {},
            "tokens_in": s.meta.tokens_in, "tokens_out": s.meta.tokens_out, "cost_usd": s.meta.cost_usd,
        })
        previous = code
    st = t.start
    return {"task": t.task_id, "task_hash": st.task_hash, "agent": st.agent, "sandbox": st.sandbox.get("name"),
            "hardware": st.hardware, "config": st.config,
            "end": t.end.model_dump(mode="json", by_alias=True) if t.end else {}, "turns": turns, "file": str(t.path)}


def _bench_row(b: dict) -> dict:
    """A benchmark size as the page shows it: the scored figures (modelled on CPUs), and the wall time beside."""
    row = {k: b.get(k) for k in ("size_bytes", "time_us", "algbw_gbps", "busbw_gbps", "roofline_gbps",
                                 "roofline_pct", "verified")}
    m = b.get("modelled")
    if m:
        row.update(wall_us=b.get("time_us"), time_us=m.get("time_us"), algbw_gbps=m.get("algbw_gbps"),
                   busbw_gbps=m.get("busbw_gbps"), roofline_pct=m.get("roofline_pct"), modelled=m.get("link_model"))
    return row
