"""The replay agent: plays back the actions recorded in a trace, turn by turn."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ..config import StrictModel
from ..errors import CardError
from ..trace.records import read_trace
from .base import AgentCard


class ReplayParams(StrictModel):
    trace: str = Field(description="path of the trace to replay")


class ReplayAgent:
    def __init__(self, card: AgentCard):
        self.name = card.name
        self.params = card.parse_params(ReplayParams)
        self.trace = read_trace(card.resolve(self.params.trace))
        self._i = 0

    def reset(self, observation: dict[str, Any], info: dict[str, Any]) -> None:
        if info.get("task_id") != self.trace.task_id:
            raise CardError(f"trace is for task {self.trace.task_id}, the env plays {info.get('task_id')}")
        self._i = 0

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        if self._i >= len(self.trace.steps):
            raise CardError("the trace has no more recorded turns")
        step = self.trace.steps[self._i]
        self._i += 1
        action = step.action
        if action.tool is None:
            return action.raw or ""
        return {"tool": action.tool, "files": dict(action.files)}

    def close(self) -> None:
        pass
