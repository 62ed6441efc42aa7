"""The reference agent: plays a fixed plan with the task's starter and reference (smoke runs, calibration)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ..cards import load_task
from ..config import StrictModel
from .base import AgentCard


class ReferenceParams(StrictModel):
    plan: list[str] = Field(default_factory=lambda: ["check:starter", "check:reference", "submit:reference"],
                            description="steps 'tool:which' with which in starter | reference | last")


class ReferenceAgent:
    def __init__(self, card: AgentCard):
        self.name = card.name
        self.params = card.parse_params(ReferenceParams)
        self._sources: dict[str, str] = {}
        self._step = 0

    def reset(self, observation: dict[str, Any], info: dict[str, Any]) -> None:
        task = load_task(info["task_id"])
        self._sources = {"starter": task.starter, "reference": task.reference_source(), "last": ""}
        self._step = 0

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        plan = self.params.plan
        tool, _, which = plan[min(self._step, len(plan) - 1)].partition(":")
        self._step += 1
        return {"tool": tool, "source": self._sources.get(which or "last", ""),
                "meta": {"message": f"plan step {self._step}: {tool} with the {which or 'last'} code"}}

    def close(self) -> None:
        pass
