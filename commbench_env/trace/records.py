"""Episode traces: one self-contained JSONL file per episode, appended and flushed after every step.

Records: `episode_start` (task card + hash, sandbox profile, hardware, agent, config), one `step` per turn
(action with full source, observation text, judge result, reward and its parts, usage, timings), `episode_end`.
A crash mid-episode leaves every finished step on disk.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACE_SCHEMA = "commbench-trace/1"


class TraceWriter:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the episode
        self.closed = False

    def write(self, record: dict[str, Any]) -> None:
        if self.closed:
            return
        record.setdefault("time", time.time())
        self._fh.write(json.dumps(record, default=str) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self.closed:
            self._fh.close()
            self.closed = True


def new_trace_path(trace_dir: Path, task_id: str) -> tuple[Path, str]:
    episode_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]
    return trace_dir / f"{task_id.replace('/', '__')}--{episode_id}.jsonl", episode_id


@dataclass
class Trace:
    path: Path
    start: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None

    @property
    def task_id(self) -> str:
        return self.start.get("task_id", "?")

    @property
    def complete(self) -> bool:
        return self.end is not None


def read_trace(path: Path | str) -> Trace:
    """Load a trace; a truncated last line (a crash while writing) is ignored."""
    path = Path(path)
    start: dict[str, Any] | None = None
    steps, end = [], None
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = rec.get("type")
            if kind == "episode_start":
                start = rec
            elif kind == "step":
                steps.append(rec)
            elif kind == "episode_end":
                end = rec
    if start is None:
        raise ValueError(f"{path}: not a CommBench trace (no episode_start record)")
    if start.get("schema") != TRACE_SCHEMA:
        raise ValueError(f"{path}: trace schema {start.get('schema')!r} is not {TRACE_SCHEMA!r}")
    return Trace(path=path, start=start, steps=steps, end=end)


def format_trace(trace: Trace, show_source: bool = False) -> str:
    s = trace.start
    lines = [f"trace {trace.path.name}",
             f"  task {s.get('task_id')} (hash {s.get('task_hash')}), sandbox {s.get('sandbox', {}).get('name')}, "
             f"world {s.get('config', {}).get('world_size')}, agent {s.get('agent', {}).get('name', '-')}"]
    for st in trace.steps:
        jr = st.get("judge_result") or {}
        verdict = jr.get("verdict", "-")
        bench = jr.get("benchmark") or []
        bw = f", busbw {bench[-1]['busbw_gbps']:.3f} GB/s at {bench[-1]['size_bytes']} B" if bench else ""
        rw = st.get("reward", 0.0)
        lines.append(f"  turn {st['turn']}: {st['action'].get('tool', '?'):<9} -> {verdict}{bw}; reward {rw:.3f}"
                     + (" [terminated]" if st.get("terminated") else "") + (" [truncated]" if st.get("truncated") else ""))
        summary = jr.get("summary") or st.get("error", "")
        if summary:
            lines.append(f"      {summary.splitlines()[0][:160]}")
        if show_source:
            for name, text in (st["action"].get("files") or {}).items():
                lines.append(f"      --- {name} ---")
                lines += ["      " + ln for ln in text.splitlines()]
    e = trace.end
    if e:
        lines.append(f"  end: reward {e.get('reward', 0):.3f}, turns {e.get('turns')}, verdict {e.get('final_verdict')}, "
                     f"{e.get('duration_s', 0):.1f} s")
    else:
        lines.append("  (episode did not finish: no end record)")
    return "\n".join(lines)
