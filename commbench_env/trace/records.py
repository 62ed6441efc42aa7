"""Episode traces: one self-contained JSONL file per episode, appended and flushed after every step.

Three typed records, shared by the writer (the episode core), the reader, reports, the viewer and replay:
`EpisodeStart` (task card and hash, sandbox profile, hardware, agent, config), one `TraceStep` per turn (the action
with its full source, the observation, the whole JudgeResult, the reward and its parts, usage, timings) and
`EpisodeEnd`. A crash mid-episode leaves every finished step on disk; a torn last line is skipped when read.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..judge.host.result import JudgeResult
from ..score.reward import RewardBreakdown
from .versions import Versions

TRACE_SCHEMA = "commbench-trace/1"


class _Record(BaseModel):
    # populate_by_name: `schema` and `return` are field aliases (names pydantic or Python keep for themselves);
    # extra keys are ignored so that traces written by a later minor version still load
    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    time: float = Field(default_factory=time.time)


class EpisodeStart(_Record):
    type: Literal["episode_start"] = "episode_start"
    trace_schema: str = Field(default=TRACE_SCHEMA, alias="schema")
    episode_id: str = ""
    task_id: str
    task_hash: str = ""
    task_card: dict[str, Any] = Field(default_factory=dict, description="the card without its cases")
    task_view: str = ""
    sandbox: dict[str, Any] = Field(default_factory=dict, description="the sandbox profile")
    hardware: dict[str, Any] = Field(default_factory=dict)
    agent: dict[str, Any] = Field(default_factory=dict, description="the agent card")
    sandbox_slot: dict[str, Any] | None = None
    config: dict[str, Any] = Field(default_factory=dict, description="the episode config, world size included")
    seed: int | None = None
    versions: Versions = Field(default_factory=Versions, description="judge, timing and link-model versions, image "
                               "digest and hardware fingerprint: what makes two results comparable (empty in traces "
                               "written before they were recorded)")

    @property
    def agent_name(self) -> str:
        return str(self.agent.get("name", "-"))

    @property
    def world_size(self) -> int | None:
        return self.config.get("world_size")


class TraceAction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tool: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    raw: str | None = Field(default=None, description="an action that could not be parsed, as text")


class TurnMeta(BaseModel):
    """What the agent reported with its action: its message and usage (the LLM agents fill these)."""

    model_config = ConfigDict(extra="allow")
    message: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0


class TraceStep(_Record):
    type: Literal["step"] = "step"
    turn: int
    action: TraceAction = Field(default_factory=TraceAction)
    meta: TurnMeta = Field(default_factory=TurnMeta)
    observation: str = ""
    judge_result: JudgeResult | None = None
    reward: float = 0.0
    reward_parts: RewardBreakdown | None = None
    turn_score: float | None = None
    sandbox_slot: dict[str, Any] | None = None
    terminated: bool = False
    truncated: bool = False
    step_s: float = 0.0
    error: str | None = Field(default=None, description="why the action could not be parsed")

    @property
    def verdict(self) -> str | None:
        return self.judge_result.verdict.value if self.judge_result else None


class EpisodeEnd(_Record):
    type: Literal["episode_end"] = "episode_end"
    status: Literal["finished", "interrupted"] = "finished"
    reward: float = 0.0
    episode_return: float = Field(default=0.0, alias="return")
    turn_rewards: list[float] = Field(default_factory=list)
    turns: int = 0
    final_verdict: str | None = None
    duration_s: float = 0.0


TraceRecord = EpisodeStart | TraceStep | EpisodeEnd
_KINDS: dict[str, type[_Record]] = {"episode_start": EpisodeStart, "step": TraceStep, "episode_end": EpisodeEnd}


class TraceWriter:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the episode
        self.closed = False

    def write(self, record: TraceRecord) -> None:
        if self.closed:
            return
        self._fh.write(record.model_dump_json(by_alias=True) + "\n")
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
    start: EpisodeStart
    steps: list[TraceStep] = field(default_factory=list)
    end: EpisodeEnd | None = None

    @property
    def task_id(self) -> str:
        return self.start.task_id

    @property
    def complete(self) -> bool:
        return self.end is not None

    @property
    def meta(self) -> list[TurnMeta]:
        return [s.meta for s in self.steps]


def read_trace(path: Path | str) -> Trace:
    """Load a trace. A torn last line (a crash while writing) is skipped; a record that is whole JSON but not a
    valid record is an error naming the file and line."""
    path = Path(path)
    start: EpisodeStart | None = None
    steps: list[TraceStep] = []
    end: EpisodeEnd | None = None
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = _KINDS.get(raw.get("type")) if isinstance(raw, dict) else None
            if kind is None:
                continue
            if kind is EpisodeStart and raw.get("schema") != TRACE_SCHEMA:
                raise ValueError(f"{path}: trace schema {raw.get('schema')!r} is not {TRACE_SCHEMA!r}")
            try:
                rec = kind.model_validate(raw)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise ValueError(f"{path}, line {n}: not a valid {raw['type']} record ({where}: {first['msg']})") from None
            if isinstance(rec, EpisodeStart):
                start = rec
            elif isinstance(rec, TraceStep):
                steps.append(rec)
            else:
                end = rec  # type: ignore[assignment]
    if start is None:
        raise ValueError(f"{path}: not a CommBench trace (no episode_start record)")
    return Trace(path=path, start=start, steps=steps, end=end)


def format_trace(trace: Trace, show_source: bool = False) -> str:
    s = trace.start
    lines = [f"trace {trace.path.name}",
             f"  task {s.task_id} (hash {s.task_hash}), sandbox {s.sandbox.get('name')}, "
             f"world {s.world_size}, agent {s.agent_name}"]
    for st in trace.steps:
        jr = st.judge_result
        bench = jr.benchmark if jr else []
        bw = (f", busbw {bench[-1].scored_busbw_gbps:.3f} GB/s at {bench[-1].size_bytes} B"
              + (f" (modelled on {bench[-1].modelled.link_model})" if bench[-1].modelled else "") if bench else "")
        lines.append(f"  turn {st.turn}: {st.action.tool or '?':<9} -> {st.verdict or '-'}{bw}; reward {st.reward:.3f}"
                     + (" [terminated]" if st.terminated else "") + (" [truncated]" if st.truncated else ""))
        summary = (jr.summary if jr else "") or st.error or ""
        if summary:
            lines.append(f"      {summary.splitlines()[0][:160]}")
        if show_source:
            for name, text in st.action.files.items():
                lines.append(f"      --- {name} ---")
                lines += ["      " + ln for ln in text.splitlines()]
    e = trace.end
    if e:
        lines.append(f"  end: {e.status}, reward {e.reward:.3f}, turns {e.turns}, verdict {e.final_verdict}, "
                     f"{e.duration_s:.1f} s")
    else:
        lines.append("  (episode did not finish: no end record)")
    return "\n".join(lines)
