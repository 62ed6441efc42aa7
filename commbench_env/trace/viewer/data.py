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
            end = t.end or {}
            meta = [s.get("meta") or {} for s in t.steps]
            self.rows.append(EpisodeRow(
                id=eid, run=run, task=t.task_id, agent=str((t.start.get("agent") or {}).get("name", "-")),
                reward=float(end.get("reward", 0.0)), turns=len(t.steps),
                verdict=str(end.get("final_verdict") or "unfinished"),
                cost_usd=sum(float(m.get("cost_usd") or 0) for m in meta),
                tokens=sum(int(m.get("tokens_in") or 0) + int(m.get("tokens_out") or 0) for m in meta),
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
        files = (s.get("action") or {}).get("files") or {}
        code = "\n".join(files.values()) if files else previous
        diff = "".join(difflib.unified_diff(previous.splitlines(True), code.splitlines(True), "previous", "this turn"))
        jr = s.get("judge_result") or {}
        bench = jr.get("benchmark") or []
        first_bad = next((c.get("mismatch") for c in jr.get("cases") or [] if c.get("mismatch")), None)
        turns.append({
            "turn": s.get("turn"), "tool": (s.get("action") or {}).get("tool"), "message": (s.get("meta") or {}).get("message", ""),
            "code": code, "diff": diff if files else "", "feedback": s.get("observation", ""),
            "verdict": jr.get("verdict"), "summary": jr.get("summary", ""), "mismatch": first_bad,
            "benchmark": [{k: b.get(k) for k in ("size_bytes", "time_us", "algbw_gbps", "busbw_gbps", "roofline_gbps",
                                                 "roofline_pct", "verified")} for b in bench],
            "roofline": jr.get("roofline"),
            "profile": [{"rank": p.get("rank"), "rows": (p.get("rows") or [])[:10]} for p in jr.get("profile") or []],
            "reward": s.get("reward", 0.0), "reward_parts": s.get("reward_parts") or {},
            "tokens_in": (s.get("meta") or {}).get("tokens_in", 0), "tokens_out": (s.get("meta") or {}).get("tokens_out", 0),
            "cost_usd": (s.get("meta") or {}).get("cost_usd", 0.0),
        })
        previous = code
    st = t.start
    return {"task": t.task_id, "task_hash": st.get("task_hash"), "agent": st.get("agent") or {},
            "sandbox": (st.get("sandbox") or {}).get("name"), "hardware": st.get("hardware") or {},
            "config": st.get("config") or {}, "end": t.end or {}, "turns": turns, "file": str(t.path)}
