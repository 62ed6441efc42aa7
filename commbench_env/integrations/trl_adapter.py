"""TRL's GRPOTrainer on CommBench.

Single turn: each completion is one answer; `CommBenchReward` takes the code out of it and judges it on its row's
task (a one-turn episode that submits it), many completions at once::

    rows = task_rows("smoke", world_size=2, repeats=64)
    trainer = GRPOTrainer(model=..., reward_funcs=CommBenchReward(parallel=8), train_dataset=task_dataset(rows), ...)

Multi-turn: TRL's `environment_factory` gives every rollout its own `CommBenchToolEnv`, whose public methods are the
env's tools (compile, check, benchmark, profile, sanitize, submit: TRL shows them to the model as function tools and
runs the calls it makes; the same for every task, so a torch task answers sanitize without running anything); its
rows reset the env on their task. The episode's reward comes from `CommBenchEpisodeReward`,
which scores every rollout of the batch in parallel: the submitted code's reward, or, if the model stopped without
submitting, its last code scored as on truncation::

    rows = task_rows("smoke", world_size=2, multi_turn=True)
    trainer = GRPOTrainer(model=..., train_dataset=task_dataset(rows), reward_funcs=CommBenchEpisodeReward(),
                          environment_factory=CommBenchToolEnv.factory(max_turns=6), ...)

A reward of None (TRL turns it into NaN and leaves the sample out) means an infrastructure failure, never a score.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import CommBenchError
from ..run.scoring import LocalScorer, Score, Scorer, Submission, extract_code
from .common import ToolEpisode


def task_dataset(rows: Sequence[dict[str, Any]]) -> Any:
    """A datasets.Dataset of `task_rows` rows (the columns TRL reads: prompt; ours: task, world_size)."""
    from datasets import Dataset

    return Dataset.from_list(list(rows))


def _column(kwargs: dict[str, Any], name: str, n: int, required: bool) -> list[Any]:
    if name in kwargs:
        return list(kwargs[name])
    if required:
        raise CommBenchError(f"the training dataset has no {name!r} column: each row needs the id of its task "
                             "(build rows with commbench_env.integrations.task_rows)")
    return [None] * n


class CommBenchReward:
    """A GRPOTrainer reward function: the code of each completion (its last fenced block, else its whole text)
    judged on its row's task; returns one reward in [0, 1] per completion (None: infrastructure failure).

    `scorer` judges the submissions: by default a LocalScorer with `parallel` envs on this host (`sandbox`,
    `env_options` as for CommBenchEnv); pass a `ray_backend.RayScorer` to judge on a Ray cluster.
    """

    def __init__(self, scorer: Scorer | None = None, *, sandbox: str = "local-cpu", parallel: int = 2,
                 task_column: str = "task", world_column: str = "world_size", **env_options: Any):
        self.scorer = scorer or LocalScorer(sandbox, parallel=parallel, **env_options)
        self.task_column = task_column
        self.world_column = world_column
        self.__name__ = "commbench"  # TRL names the reward's metrics after it
        self.last_scores: list[Score] = []
        self.verdicts: collections.Counter = collections.Counter()  # over every call: what the judge said

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        n = len(completions)
        tasks = _column(kwargs, self.task_column, n, required=True)
        worlds = _column(kwargs, self.world_column, n, required=False)
        subs = [Submission(t, extract_code(c), w) for t, c, w in zip(tasks, completions, worlds)]
        scores = self.scorer.score(subs)
        self.last_scores = scores
        _log(kwargs, scores, self.verdicts)
        return [s.reward for s in scores]

    def close(self) -> None:
        self.scorer.close()


def _verdict(s: Score) -> str:
    return s.verdict or ("infra_error" if s.reward is None else "no code")


def _log(kwargs: dict[str, Any], scores: Sequence[Score], counts: collections.Counter) -> None:
    """Verdicts into TRL's completions table, the fraction correct into its metrics (when TRL passes the hooks)."""
    counts.update(_verdict(s) for s in scores)
    if callable(kwargs.get("log_extra")):
        kwargs["log_extra"]("commbench_verdict", [_verdict(s) for s in scores])
    if callable(kwargs.get("log_metric")) and scores:
        kwargs["log_metric"]("commbench/correct", sum(s.correct for s in scores) / len(scores))


class CommBenchToolEnv:
    """One multi-turn episode per rollout, for GRPOTrainer's `environment_factory`.

    TRL exposes every public method but `reset` as a tool the model can call; each is one env step with the model's
    complete file as `source`, and returns the judge's feedback. The episode's rules (sandbox made at the first
    reset and reused, infrastructure failures never scored, `remote=True` for a Ray actor) are `common.ToolEpisode`'s.
    """

    def __init__(self, sandbox: str = "local-cpu", max_turns: int = 6, *, remote: bool = False, world: int = 2,
                 **env_options: Any):
        self._episode = ToolEpisode(sandbox, max_turns, remote=remote, world=world, **env_options)

    @classmethod
    def factory(cls, **kwargs: Any) -> Callable[[], "CommBenchToolEnv"]:
        """A no-argument constructor for `environment_factory`, with these keyword arguments."""
        return functools.partial(cls, **kwargs)

    def _drop_env(self) -> None:
        self._episode.close()

    def reset(self, **row: Any) -> str | None:
        self._episode.reset(row.get("task"), row.get("world_size"))
        return None  # the row's prompt already holds the statement

    def _act(self, tool: str, source: str) -> str:
        return self._episode.act({"tool": tool, "source": source})

    # -- tools: the docstrings and type hints become the function schemas the model sees ----------------------
    def compile(self, source: str) -> str:
        """Build the solution file and run the static checks only (imports, forbidden APIs); nothing runs.

        Args:
            source: The complete text of the solution file named in the task; an empty string reuses the last code.
        """
        return self._act("compile", source)

    def check(self, source: str) -> str:
        """Run the visible and hidden correctness cases on the solution at the task's world size.

        Args:
            source: The complete text of the solution file named in the task; an empty string reuses the last code.
        """
        return self._act("check", source)

    def benchmark(self, source: str) -> str:
        """Time the solution at the task's benchmark sizes (every timed output is verified too).

        Args:
            source: The complete text of the solution file named in the task; an empty string reuses the last code.
        """
        return self._act("benchmark", source)

    def profile(self, source: str) -> str:
        """Run the solution under the profiler and report where the time goes, per rank.

        Args:
            source: The complete text of the solution file named in the task; an empty string reuses the last code.
        """
        return self._act("profile", source)

    def sanitize(self, source: str) -> str:
        """CUDA tasks only: run the solution under compute-sanitizer (memcheck, racecheck, synccheck) on the
        smallest case and report what it finds. A torch task answers that nothing was run.

        Args:
            source: The complete text of the solution file named in the task; an empty string reuses the last code.
        """
        return self._act("sanitize", source)

    def submit(self, source: str) -> str:
        """Final scoring (correctness, then speed against the reference). Ends the episode.

        Args:
            source: The complete text of the solution file named in the task; an empty string reuses the last code.
        """
        return self._act("submit", source)


class CommBenchEpisodeReward:
    """The reward function that goes with CommBenchToolEnv: every rollout's episode reward, the unfinished ones
    scored `parallel` at a time (each rollout has its own env, so they judge concurrently)."""

    def __init__(self, parallel: int = 4):
        self.parallel = parallel
        self.__name__ = "commbench_episode"
        self.last_scores: list[Score] = []
        self.verdicts: collections.Counter = collections.Counter()

    def __call__(self, prompts: list[Any], completions: list[Any],
                 environments: Sequence[CommBenchToolEnv] | None = None, **kwargs: Any) -> list[float | None]:
        if environments is None:
            raise CommBenchError("CommBenchEpisodeReward needs GRPOTrainer(environment_factory=CommBenchToolEnv...)")
        envs = list(environments)
        episodes = [e._episode for e in envs]
        with ThreadPoolExecutor(max_workers=max(1, min(self.parallel, len(envs)))) as pool:
            rewards = list(pool.map(ToolEpisode.final_reward, episodes))
        scores = [Score(reward=r, verdict=e.verdict, correct=e.correct) for r, e in zip(rewards, episodes)]
        self.last_scores = scores
        _log(kwargs, scores, self.verdicts)
        return rewards
