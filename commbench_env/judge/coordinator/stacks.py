"""A hung rank's Python stacks as an agent can use them: faulthandler dumps every thread, most recent call first,
with the judge's own frames around the candidate's and no source text. This keeps, per thread that is inside
candidate code, the candidate's frames in call order with their source lines, then the library call it waits in;
the judge's frames and the host's paths never reach the agent."""

from __future__ import annotations

import re
from pathlib import Path

_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")


def _threads(dump: str) -> list[list[tuple[str, int, str]]]:
    threads: list[list[tuple[str, int, str]]] = []
    for line in dump.splitlines():
        if _THREAD.match(line):
            threads.append([])
        m = _FRAME.match(line)
        if m:
            if not threads:
                threads.append([])
            threads[-1].append((m["path"], int(m["line"]), m["func"]))
    return threads


def _library(path: str) -> str:
    """A library frame's path from its package down (site-packages/torch/... -> torch/...)."""
    parts = Path(path).parts
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) + 1:])
    return Path(path).name


def candidate_stack(dump: str, entry_file: str, judge_root: str, source: str = "") -> str:
    """The part of a faulthandler dump that concerns the candidate (see the module docstring), its lines quoted
    from `source` (the file as the host sent it); a note when no thread was in candidate code."""
    source_lines = source.splitlines()
    out = []
    for frames in _threads(dump):
        mine = [i for i, (path, _, _) in enumerate(frames) if Path(path).name == entry_file]
        if not mine:
            continue
        lines = [f"thread {len(out) + 1} (most recent call last):"]
        for i in reversed(mine):
            path, line, func = frames[i]
            lines.append(f"  {entry_file}, line {line}, in {func}")
            text = source_lines[line - 1].strip() if 0 < line <= len(source_lines) else ""
            if text:
                lines.append(f"    {text}")
        inner = [f for f in frames[: mine[0]] if not f[0].startswith(judge_root)]
        if inner:
            path, line, func = inner[0]  # the innermost library frame: where it waits
            lines.append(f"  waiting in {func} ({_library(path)}, line {line})")
        out.append("\n".join(lines))
    if not out:
        return "no thread was running your code when the rank was stopped (it hung in the judge's harness, e.g. " \
               "waiting for the other ranks between calls)"
    return "\n".join(out)
