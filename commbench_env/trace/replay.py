"""Replay a trace: re-run each recorded action through the judge and compare verdicts and figures.

The same sandbox profile (or another one, to reproduce on other hardware) judges each turn's recorded code in the
mode the turn used; a turn matches when the verdict is the same and every benchmark figure is within a relative
tolerance of the recording (timings move between runs; the default tolerance is 50 % on CPU-class noise).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..episode.actions import TOOL_TO_MODE
from ..cards import load_task
from ..judge.host.client import JudgeClient
from ..sandbox import open_sandbox
from .records import read_trace


@dataclass
class TurnReplay:
    turn: int
    tool: str | None
    recorded: str | None
    replayed: str | None
    figures: list[tuple[int, float, float]]  # (size, recorded time us, replayed time us)
    match: bool
    note: str = ""


def replay_trace(path: Path | str, *, sandbox: str | None = None, turn: int | None = None,
                 tolerance: float = 0.5) -> tuple[str, list[TurnReplay]]:
    """Returns (task id, one TurnReplay per replayed turn)."""
    trace = read_trace(path)
    task = load_task(trace.task_id)
    note = "" if task.hash == trace.start.task_hash else "task card changed since the recording"
    profile = sandbox or trace.start.sandbox.get("name", "local-cpu")
    world = trace.start.world_size or task.card.world.default_size
    out: list[TurnReplay] = []
    files: dict[str, str] = {}
    with open_sandbox(profile) as sb:
        client = JudgeClient(sb)
        try:
            for step in trace.steps:
                files = step.action.files or files
                if turn is not None and step.turn != turn:
                    continue
                recorded, tool = step.judge_result, step.action.tool
                if not tool or not files or recorded is None:
                    out.append(TurnReplay(step.turn, tool, None, None, [], True, "nothing was judged"))
                    continue
                mode = recorded.mode or TOOL_TO_MODE[tool]
                res = client.evaluate(task, files, mode, world)
                rec_bench = {b.size_bytes: b.time_us for b in recorded.benchmark}
                figs = [(b.size_bytes, rec_bench[b.size_bytes], b.time_us) for b in res.benchmark if b.size_bytes in rec_bench]
                within = all(abs(new - old) <= tolerance * max(old, 1e-9) for _, old, new in figs)
                same = res.verdict == recorded.verdict
                out.append(TurnReplay(step.turn, tool, recorded.verdict.value, res.verdict.value, figs,
                                      same and within, note if note else ("" if within else "figures differ")))
        finally:
            client.close()
    return trace.task_id, out
