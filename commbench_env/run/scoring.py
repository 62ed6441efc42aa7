"""Scoring code for RL trainers: each submission is judged as a one-turn episode (submit) through the env.

A trainer's reward function gets model completions; `extract_code` takes the solution file out of each one and a
scorer judges them, many at once: `LocalScorer` on this host (a few envs, each with its own sandbox and warm judge,
used from a thread pool), `ray_backend.RayScorer` on the nodes of a Ray cluster. Both return one `Score` per
submission, in order. An infrastructure failure (the sandbox died, the judge could not run) gives `reward=None`:
trainers should skip such samples rather than score them as the model's fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from ..episode.actions import code_blocks
from ..cards import load_task
from ..errors import SandboxError
from .infra import InfraPolicy


def completion_text(completion: Any) -> str:
    """The text of a completion: a string as is; chat messages: the assistant messages' contents joined."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)):
        parts = []
        for msg in completion:
            if isinstance(msg, dict) and msg.get("role", "assistant") == "assistant":
                content = msg.get("content") or ""
                if isinstance(content, list):  # content blocks
                    content = "".join(b.get("text", "") for b in content if isinstance(b, dict))
                parts.append(str(content))
        return "\n".join(parts)
    raise TypeError(f"a completion is a string or a list of chat messages, not {type(completion).__name__}")


def extract_code(completion: Any) -> str:
    """The solution file in a completion: its last fenced code block, or the whole text when it has none."""
    text = completion_text(completion)
    blocks = code_blocks(text)
    return blocks[-1] if blocks else text


@dataclass(frozen=True)
class Submission:
    task_id: str
    source: str
    world_size: int | None = None  # None: the task's default world size


@dataclass
class Score:
    reward: float | None          # None: infrastructure failure, not the code's fault
    verdict: str | None = None    # judge verdict of the final evaluation (None: nothing was judged, e.g. no code)
    correct: bool = False
    speedup: float | None = None
    feedback: str = ""            # what the judge told the agent
    trace_path: str | None = None  # on the host (or Ray node) that judged it
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Scorer(Protocol):
    def score(self, submissions: Sequence[Submission]) -> list[Score]: ...

    def close(self) -> None: ...


class Env(Protocol):
    """The part of the Gymnasium API scoring uses (CommBenchEnv, or ray_backend.RemoteEnv)."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]: ...

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]: ...

    def close(self) -> None: ...


def score_submission(env: Env, sub: Submission) -> Score:
    """Judge one submission in `env` (made with max_turns=1): reset on its task, submit its code, read the reward.

    SandboxError propagates: the caller decides whether to retry with a fresh env.
    """
    world = load_task(sub.task_id).world_for(sub.world_size)
    env.reset(options={"task": sub.task_id, "world_size": world})
    env.step({"tool": "submit", "source": sub.source})
    out = env.unwrapped.last_outcome  # typed (episode.StepOutcome), whatever wrappers env has
    return Score(reward=float(out.episode_reward), verdict=out.verdict, correct=out.correct,
                 speedup=out.parts.speedup if out.parts else None, feedback=out.feedback,
                 trace_path=out.context.get("trace_path"))


def score_with_retry(make_env, env: Env | None, sub: Submission, retries: int = 1) -> tuple[Score, Env | None]:
    """score_submission, retried in a fresh env after a SandboxError; returns the score and the env to keep."""
    policy, error = InfraPolicy(retries), ""
    for _ in policy.attempts():
        if env is None:
            env = make_env(sub)
        try:
            return score_submission(env, sub), env
        except SandboxError as exc:
            error = policy.describe(exc)
            env.close()
            env = None
    return Score(reward=None, error=error), env


class LocalScorer:
    """Judge submissions on this host, `parallel` at a time: each submission is a one-turn env borrowing a warm
    sandbox from a SandboxPool, which reuses sandboxes across calls and replaces one that failed.

    `env_options` are CommBenchEnv keyword arguments (reward, reference, trace_dir, feedback_chars, ...).
    """

    def __init__(self, sandbox: str = "local-cpu", parallel: int = 2, retries: int = 1, **env_options: Any):
        from ..sandbox.pool import SandboxPool

        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        self.sandbox = sandbox
        self.parallel = parallel
        self.retries = retries
        self.env_options = {k: v for k, v in env_options.items() if k != "max_turns"}
        self._sandboxes = SandboxPool(sandbox, max_sandboxes=parallel)
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="commbench-score")
        self._closed = False

    def _make_env(self, sub: Submission) -> Env:
        from ..episode.gym_env import CommBenchEnv

        return CommBenchEnv(task=sub.task_id, sandbox_pool=self._sandboxes, max_turns=1, **self.env_options)

    def _one(self, sub: Submission) -> Score:
        score, env = score_with_retry(self._make_env, None, sub, self.retries)
        if env is not None:
            env.close()  # gives the sandbox back to the pool
        return score

    def score(self, submissions: Sequence[Submission]) -> list[Score]:
        if self._closed:
            raise RuntimeError("this scorer was closed")
        return list(self._pool.map(self._one, submissions))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        self._sandboxes.close()

    def __enter__(self) -> "LocalScorer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
