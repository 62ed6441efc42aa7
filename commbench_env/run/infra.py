"""The one infrastructure-failure policy: what counts as the infrastructure's fault, how often it is retried,
and what a failed attempt leaves behind. Every driver that plays episodes or scores code uses it (evaluation
runs, the rollout pool, the scorers), so a failure is never scored, never a turn, and retried the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class InfraPolicy:
    """The infrastructure's fault is a SandboxError (and its JudgeInfraError): the sandbox or the judge failed,
    never the agent. Its callers catch that type and ask the policy how often to try again."""

    retries: int = 2  # attempts after the first, each on a fresh env and sandbox

    def attempts(self) -> Iterator[int]:
        """1, 2, ... up to 1 + retries."""
        return iter(range(1, self.retries + 2))

    @staticmethod
    def describe(exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}"

    @staticmethod
    def discard(trace_path: str | Path | None) -> None:
        """A failed attempt's partial trace goes: a report must never count it as the agent's episode."""
        if trace_path:
            Path(trace_path).unlink(missing_ok=True)
