"""The scripted agent: one file per turn from a folder, named NN-<tool>.py (e.g. 01-check.py, 02-submit.py).

An empty file sends no source, so the env reuses the previous turn's code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field

from ..episode.actions import TOOLS
from ..config import StrictModel
from ..errors import CardError
from .base import AgentCard

_NAME = re.compile(r"^\d+-([a-z]+)(\.\w+)?$")


class ScriptedParams(StrictModel):
    folder: str = Field(description="folder of NN-<tool>.py files; {task} is replaced by the task id")


def load_script(folder: Path) -> list[tuple[str, str]]:
    if not folder.is_dir():
        raise CardError(f"scripted agent: folder {folder} does not exist")
    steps = []
    for p in sorted(folder.iterdir()):
        m = _NAME.match(p.name)
        if not m:
            continue
        if m.group(1) not in TOOLS:
            raise CardError(f"scripted agent: {p.name}: unknown tool {m.group(1)!r}; expected one of {', '.join(TOOLS)}")
        steps.append((m.group(1), p.read_text()))
    if not steps:
        raise CardError(f"scripted agent: no NN-<tool>.py files in {folder}")
    return steps


class ScriptedAgent:
    def __init__(self, card: AgentCard):
        self.name = card.name
        self.card = card
        self.params = card.parse_params(ScriptedParams)
        self._steps: list[tuple[str, str]] = []
        self._i = 0

    def reset(self, observation: dict[str, Any], info: dict[str, Any]) -> None:
        folder = self.card.resolve(self.params.folder.replace("{task}", info["task_id"]))
        self._steps = load_script(folder)
        self._i = 0

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        tool, source = self._steps[min(self._i, len(self._steps) - 1)]
        self._i += 1
        return {"tool": tool, "source": source}

    def close(self) -> None:
        pass
