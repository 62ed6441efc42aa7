"""The typed outcome of one turn of an episode, for every driver (the runner, the scorers, trainers, rollouts).

Drivers read `CommBenchEnv.last_outcome` (through any wrapper: `env.unwrapped.last_outcome`) instead of keys of
the Gymnasium `info` dict. It holds both sides of the trust line: what the agent may see (`feedback`, and `info()`,
built from the result's `public()` view) and what only the host keeps (the full `result`, with hidden cases).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .judge.host.result import JudgeResult
from .reward import RewardBreakdown


@dataclass
class StepOutcome:
    turn: int
    feedback: str
    reward: float  # this turn's reward under the env's turn-reward schedule
    terminated: bool
    truncated: bool
    tool: str | None = None
    result: JudgeResult | None = None  # the full result (host side only; `info()` carries its public view)
    parts: RewardBreakdown | None = None
    turn_score: float | None = None
    final_reward: float | None = None  # the episode's reward, on its last turn
    turn_rewards: list[float] | None = None  # what each turn earned, on the last turn
    parse_error: str | None = None
    sandbox: dict[str, Any] | None = None  # the pooled sandbox slot, if any
    step_s: float = 0.0
    context: dict[str, Any] = field(default_factory=dict)  # task_id, task_hash, trace_path

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def verdict(self) -> str | None:
        return self.result.verdict.value if self.result else None

    @property
    def correct(self) -> bool:
        return bool(self.parts and self.parts.correct)

    @property
    def episode_reward(self) -> float:
        """The reward the episode earned if this is its last turn (whatever the per-turn schedule), else this
        turn's reward."""
        return self.final_reward if self.final_reward is not None else self.reward

    def info(self) -> dict[str, Any]:
        """The Gymnasium `info` of this step: only what the agent may see."""
        out: dict[str, Any] = {"turn": self.turn, **self.context,
                               "judge_result": self.result.public().model_dump(mode="json") if self.result else None,
                               "reward_parts": self.parts.model_dump() if self.parts else None,
                               "turn_score": self.turn_score, "verdict": self.verdict, "step_s": self.step_s}
        if self.tool is not None:
            out["tool"] = self.tool
        if self.parse_error is not None:
            out["parse_error"] = self.parse_error
        if self.sandbox is not None:
            out["sandbox"] = self.sandbox
        if self.done:
            out["final_reward"] = self.final_reward
            out["turn_rewards"] = self.turn_rewards
        return out
