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
MAX_META_CHARS = 200_000  # an action's `meta` (the agent's message, usage) as JSON
# the fence languages a message's code block may name, by the task's language (a bare ``` fence always works)
FENCE_LANGUAGES = {"torch": ("python", "py", "python3"), "cuda": ("cuda", "cu", "cpp", "c++", "cxx", "c")}

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


# The one text-action grammar (the env's string actions, the LLM agent's plain-text replies, the scorers'
# completions): fenced code blocks, and a line 'tool: <name>' (markdown bold and backticks allowed).
_FENCE = re.compile(r"```([\w+.-]*)[ \t]*\n(.*?)```", re.S)
_TOOL_LINE = re.compile(r"^\s*\**\s*tool\s*\**\s*[:=]\s*`?([A-Za-z]+)`?\s*$", re.M | re.I)


def code_blocks(text: str, language: str | None = None) -> list[str]:
    """The fenced code blocks of `text`, in order: those with no tag or one of `language`'s tags
    (FENCE_LANGUAGES), or every block when `language` is None."""
    langs = FENCE_LANGUAGES.get(language or "", ())
    return [body for tag, body in _FENCE.findall(text or "") if language is None or not tag or tag.lower() in langs]


def tool_named_in(text: str) -> str | None:
    """The last 'tool: <name>' line of `text` that names a tool, or None."""
    found = [m.group(1).lower() for m in _TOOL_LINE.finditer(text or "") if m.group(1).lower() in TOOLS]
    return found[-1] if found else None


def _tool(value: Any) -> str:
    if isinstance(value, bool):
        raise ParseError(f"tool must be a name or index, got {value!r}")
    if hasattr(value, "item") and not isinstance(value, (str, int)):  # a numpy or torch scalar
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            raise ParseError(f"tool must be one name or index, got an array of shape "
                             f"{tuple(getattr(value, 'shape', ()))}") from None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return _tool(value)
    if isinstance(value, int):
        i = int(value)
        if 0 <= i < len(TOOLS):
            return TOOLS[i]
        raise ParseError(f"tool index {i} is out of range 0-{len(TOOLS) - 1}")
    if isinstance(value, str) and value.strip().lower() in TOOLS:
        return value.strip().lower()
    raise ParseError(f"unknown tool {str(value)[:40]!r}; expected one of {', '.join(TOOLS)}")


def parse_action(action: Any, entry_file: str, language: str = "torch") -> Action:
    """Accepts a dict, a JSON string, or free text with a fenced code block and a 'tool:' line. Whatever the
    action's bytes or types, the outcome is an Action or a ParseError that tells the agent what to fix."""
    try:
        return _parse(action, entry_file, language)
    except ParseError:
        raise
    except RecursionError:
        raise ParseError("the action is nested too deeply to read") from None
    except Exception as exc:  # noqa: BLE001 - any odd object an agent or trainer hands in is its error to fix
        raise ParseError(f"the action could not be read ({type(exc).__name__}: {str(exc)[:200]})") from None


def _parse(action: Any, entry_file: str, language: str) -> Action:
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
            if not m:
                raise ParseError("no 'tool: <name>' line found in the message")
            tool = tool_named_in(text) or _tool(m.group(1))  # an unknown name: _tool says which names exist
            blocks = code_blocks(text, language)
            files = {entry_file: _source_text(entry_file, blocks[-1])} if blocks else {}
            return Action(tool=tool, files=files)
    if not isinstance(action, dict):
        raise ParseError(f"an action must be a dict or a string, got {type(action).__name__}")
    unknown = {str(k)[:40] for k in action} - {"tool", "source", "files", "meta"}
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
            raise ParseError(f"this task takes one file, {entry_file!r}; got {name[:80]!r}")
        files[name] = _source_text(name, text)
    meta = action.get("meta") or {}
    if not isinstance(meta, dict):
        raise ParseError("'meta' must be a dict")
    try:
        size = len(json.dumps(meta, default=str))
    except (RecursionError, ValueError, TypeError):
        raise ParseError("'meta' must be plain JSON data, and not nested deeply") from None
    if size > MAX_META_CHARS:
        raise ParseError(f"'meta' is {size} characters as JSON; the limit is {MAX_META_CHARS}")
    return Action(tool=tool, files=files, meta=meta)


def _source_text(name: str, text: str) -> str:
    """A source file's text as the judge can take it: within the size limit, no NUL byte, valid UTF-8."""
    if len(text) > MAX_SOURCE_CHARS:
        raise ParseError(f"{name} has {len(text)} characters; the limit is {MAX_SOURCE_CHARS}")
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise ParseError(f"{name} holds a NUL character (line {line}); a source file is text")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        line = text.count("\n", 0, exc.start) + 1
        raise ParseError(f"{name} holds a character that is not valid Unicode text (a lone surrogate, "
                         f"{text[exc.start]!r}, on line {line}); send the file as UTF-8 text") from None
    return text
