"""Parsing agent actions. Anything unparseable becomes a ParseError with a message for the agent, never a crash."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOLS: tuple[str, ...] = ("compile", "check", "benchmark", "profile", "submit", "sanitize")
TOOL_TO_MODE = {"compile": "compile", "check": "check", "benchmark": "benchmark", "profile": "profile", "submit": "full",
                "sanitize": "sanitize"}
MAX_SOURCE_CHARS = 100_000

ACTION_HELP = (
    "An action is a dict {'tool': one of " + ", ".join(TOOLS) + " (or its index 0-5; sanitize runs compute-sanitizer on CUDA tasks), "
    "'source': the full text of your solution file (or 'files': {filename: text}); "
    "an empty source reuses your last one}. A JSON string of that dict, or a message with a ```python block and a "
    "line 'tool: <name>', also works."
)


@dataclass
class Action:
    tool: str
    files: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # agent's message, token usage, cost: recorded, not judged


class ParseError(ValueError):
    pass


_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)
_TOOL_LINE = re.compile(r"^\s*tool\s*[:=]\s*([a-z]+)\s*$", re.M | re.I)


def _tool(value: Any) -> str:
    if isinstance(value, bool):
        raise ParseError(f"tool must be a name or index, got {value!r}")
    if isinstance(value, int) or (hasattr(value, "item") and not isinstance(value, str)):
        i = int(value)
        if 0 <= i < len(TOOLS):
            return TOOLS[i]
        raise ParseError(f"tool index {i} is out of range 0-{len(TOOLS) - 1}")
    if isinstance(value, str) and value.strip().lower() in TOOLS:
        return value.strip().lower()
    raise ParseError(f"unknown tool {str(value)[:40]!r}; expected one of {', '.join(TOOLS)}")


def parse_action(action: Any, entry_file: str) -> Action:
    """Accepts a dict, a JSON string, or free text with a fenced code block and a 'tool:' line."""
    if isinstance(action, Action):
        return action
    if isinstance(action, str):
        text = action.strip()
        if text.startswith("{"):
            try:
                action = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ParseError(f"the action looks like JSON but does not parse: {exc}") from None
        else:
            m = _TOOL_LINE.search(text)
            blocks = _FENCE.findall(text)
            if not m:
                raise ParseError("no 'tool: <name>' line found in the message")
            return Action(tool=_tool(m.group(1)), files={entry_file: blocks[-1]} if blocks else {})
    if not isinstance(action, dict):
        raise ParseError(f"an action must be a dict or a string, got {type(action).__name__}")
    unknown = set(action) - {"tool", "source", "files", "meta"}
    if unknown:
        raise ParseError(f"unknown action keys {sorted(unknown)}")
    if "tool" not in action:
        raise ParseError("the action has no 'tool'")
    tool = _tool(action["tool"])
    files: dict[str, str] = {}
    if "files" in action and action["files"] is not None:
        if not isinstance(action["files"], dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in action["files"].items()):
            raise ParseError("'files' must map file names to text")
        files.update(action["files"])
    src = action.get("source")
    if src is not None and src != "":
        if not isinstance(src, str):
            raise ParseError(f"'source' must be text, got {type(src).__name__}")
        files[entry_file] = src
    for name, text in files.items():
        if name != entry_file:
            raise ParseError(f"this task takes one file, {entry_file!r}; got {name!r}")
        if len(text) > MAX_SOURCE_CHARS:
            raise ParseError(f"{name} has {len(text)} characters; the limit is {MAX_SOURCE_CHARS}")
    meta = action.get("meta") or {}
    if not isinstance(meta, dict):
        raise ParseError("'meta' must be a dict")
    return Action(tool=tool, files=files, meta=meta)
