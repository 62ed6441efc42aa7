"""The Gymnasium environment: one task per episode, the agent's code judged in a sandbox every turn.

An adapter over `episode.Episode`, which holds the episode itself (sandbox, turns, judge, reward, trace): this
module adds Gymnasium's spaces, seeding, the step tuple and pickling.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from gymnasium import spaces
from gymnasium.error import CustomSpaceError
from gymnasium.utils import EzPickle
from gymnasium.vector.utils import create_shared_memory

from .actions import MAX_SOURCE_CHARS, TOOLS
from ..cards import Task
from .core import CHARSET, MAX_OBS_CHARS, Episode, EpisodeConfig, StepOutcome
from ..judge.host.result import JudgeResult
from ..score.reward import RewardConfig
from ..sandbox import SandboxProfile

if TYPE_CHECKING:
    from ..sandbox.pool import SandboxPool


class PrintableText(spaces.Text):
    """spaces.Text over printable ASCII. It refuses gymnasium's shared memory: AsyncVectorEnv reads Text out of
    shared memory once, when it is built, so every later observation would be the first one (gymnasium 1.4).
    The error tells the user to pass `vector_kwargs={"shared_memory": False}`; observations then travel by pipe."""


@create_shared_memory.register(PrintableText)
def _no_shared_memory(space: PrintableText, n: int = 1, ctx: Any = None) -> Any:
    raise CustomSpaceError("CommBench observations are text that AsyncVectorEnv cannot share through memory; "
                           "use AsyncVectorEnv(..., shared_memory=False), or gymnasium.make_vec(..., "
                           "vectorization_mode='async', vector_kwargs={'shared_memory': False})")


class CommBenchEnv(gym.Env, EzPickle):
    """Observation: {'task': statement, 'feedback': judge feedback, 'turn': n}. Action: {'tool', 'source'}.

    By default the reward is 0 on intermediate turns and the final reward (see score/reward.py) on the turn that
    terminates (submit, or a passing check with terminate_on_solve) or truncates (turn budget; the last code is
    scored); `turn_reward={...}` selects another schedule (TurnRewardConfig).

    `sandbox_pool`: a SandboxPool (or a dict of its settings, for a private pool) to borrow sandboxes from instead
    of owning one. The env pickles as its constructor arguments (a pickled env is a fresh, un-reset copy), so
    AsyncVectorEnv and other processes can build it; `astep`/`areset` run the blocking judge call in a thread.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, task: str | Task = "collective/allreduce_ring", sandbox: str | SandboxProfile | None = None,
                 max_turns: int = 8, world_size: int | None = None, reward: RewardConfig | dict | None = None,
                 render_mode: str | None = None, agent: dict | None = None,
                 sandbox_pool: SandboxPool | dict | None = None, **options: Any):
        EzPickle.__init__(self, task, sandbox, max_turns, world_size, reward, render_mode, agent, sandbox_pool,
                          **options)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None")
        self.render_mode = render_mode
        self.episode = Episode(task, sandbox, max_turns, world_size, reward, agent, sandbox_pool, **options)
        self.observation_space = spaces.Dict({
            "task": PrintableText(max_length=MAX_OBS_CHARS, min_length=0, charset=CHARSET),
            "feedback": PrintableText(max_length=MAX_OBS_CHARS, min_length=0, charset=CHARSET),
            "turn": spaces.Discrete(self.episode.config.max_turns + 1),
        })
        self.action_space = spaces.Dict({
            "tool": spaces.Discrete(len(TOOLS)),
            "source": PrintableText(max_length=MAX_SOURCE_CHARS, min_length=0, charset=CHARSET),
        })

    # -- what drivers read of the episode ------------------------------------------------------------------
    @property
    def task(self) -> Task:
        return self.episode.task

    @property
    def world_size(self) -> int:
        return self.episode.world_size

    @property
    def turn(self) -> int:
        return self.episode.turn

    @property
    def config(self) -> EpisodeConfig:
        return self.episode.config

    @property
    def profile(self) -> SandboxProfile:
        return self.episode.profile

    @property
    def trace_path(self) -> Path | None:
        return self.episode.trace_path

    @property
    def feedback(self) -> str:
        return self.episode.feedback

    @property
    def last_result(self) -> JudgeResult | None:
        """The last turn's full result (hidden cases included): host side only, never the agent's."""
        return self.episode.last_result

    @property
    def last_outcome(self) -> StepOutcome | None:
        return self.episode.last_outcome

    def observation(self) -> dict[str, Any]:
        return self.episode.observation()

    # -- gymnasium API ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return self.episode.start(seed=seed, options=options, rng=self.np_random)

    def step(self, action: Any):
        outcome = self.episode.step(action)
        return self.episode.observation(), float(outcome.reward), outcome.terminated, outcome.truncated, outcome.info()

    def play_turn(self, action: Any) -> StepOutcome:
        """One turn, typed (`StepOutcome`, also kept as `last_outcome`): what `step` returns is made from it."""
        return self.episode.step(action)

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return f"turn {self.turn}/{self.config.max_turns} on {self.task.id}\n{self.feedback}"
        return None

    def close(self) -> None:
        self.episode.close()
        super().close()

    # -- asyncio -----------------------------------------------------------------------------------------------
    # The judge call blocks (it waits on processes in the sandbox), so these run reset/step in a thread of
    # `executor` (default: the loop's default executor) and the event loop stays free. One call at a time per env;
    # a cancelled await does not stop a judge call already running.
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None,
                     executor: Executor | None = None):
        return await asyncio.get_running_loop().run_in_executor(
            executor, functools.partial(self.reset, seed=seed, options=options))

    async def astep(self, action: Any, *, executor: Executor | None = None):
        return await asyncio.get_running_loop().run_in_executor(executor, self.step, action)

    async def aplay_turn(self, action: Any, *, executor: Executor | None = None) -> StepOutcome:
        return await asyncio.get_running_loop().run_in_executor(executor, self.play_turn, action)

    async def aclose(self, *, executor: Executor | None = None) -> None:
        await asyncio.get_running_loop().run_in_executor(executor, self.close)

