"""An agent plays an episode to its end: the one turn loop, written once and driven two ways.

`turn_loop` is a generator holding the loop's rules (start, the agent's first look, act and judge until the
episode ends, a stop check before every agent call and every judge run, per-turn callbacks and timings). It yields
the calls it needs made; `play` makes them in this thread, `aplay` under asyncio (the judge and synchronous agents
in an executor, async agents awaited). The runner, evaluations, the Ray workers and the rollout pool all play
episodes through these two; trainers that are themselves the agent call `Episode.step` directly.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable, Generator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from ..errors import Interrupted
from .core import Episode, StepOutcome

Call = tuple[str, tuple]  # ("start", ()), ("agent_reset", (obs, info)), ("act", (obs, info)), ("step", (action,))


@dataclass
class PlayedTurn:
    outcome: StepOutcome
    started: float  # time.monotonic() when the judge call began
    ended: float


@dataclass
class Played:
    """What an episode left: the start's info and every turn's outcome, in order."""

    info: dict[str, Any]
    turns: list[PlayedTurn] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    ended: float = 0.0

    @property
    def last(self) -> StepOutcome:
        return self.turns[-1].outcome

    @property
    def rewards(self) -> list[float]:
        return [t.outcome.reward for t in self.turns]


def turn_loop(*, should_stop: Callable[[], bool] | None = None,
              on_turn: Callable[[int, dict[str, Any]], None] | None = None,
              label: Callable[[], str] = lambda: "the episode") -> Generator[Call, Any, Played]:
    """The loop's rules; see the module docstring. `label()` names the episode in an Interrupted message."""
    stop = should_stop or (lambda: False)
    obs, info = yield ("start", ())
    played = Played(info=info)
    yield ("agent_reset", (obs, info))
    out: StepOutcome | None = None
    while out is None or not out.done:
        turn = out.turn + 1 if out else 1
        if stop():
            raise Interrupted(f"{label()}: stopped before turn {turn}")
        action = yield ("act", (obs, info))
        if stop():  # an agent call can take minutes: no judge run for a run that was stopped meanwhile
            raise Interrupted(f"{label()}: stopped before turn {turn}")
        t0 = time.monotonic()
        out, obs = yield ("step", (action,))
        info = out.info()
        played.turns.append(PlayedTurn(out, t0, time.monotonic()))
        if on_turn:
            on_turn(out.turn, info)
    played.ended = time.monotonic()
    return played


def _target_ops(target: Any) -> tuple[Callable[..., tuple], Callable[[Any], StepOutcome], Callable[[], dict]]:
    """start, step and observation of a CommBenchEnv (seeded through Gymnasium's reset) or a bare Episode."""
    if isinstance(target, Episode):
        return target.start, target.step, target.observation
    return target.reset, target.play_turn, target.observation


def play(target: Any, agent: Any, *, seed: int | None = None, options: dict[str, Any] | None = None,
         should_stop: Callable[[], bool] | None = None,
         on_turn: Callable[[int, dict[str, Any]], None] | None = None) -> Played:
    """Play one episode of `target` (a CommBenchEnv or an Episode) with a synchronous agent, in this thread."""
    start, step, observation = _target_ops(target)
    loop = turn_loop(should_stop=should_stop, on_turn=on_turn, label=lambda: target.task.id)
    reply: Any = None
    try:
        while True:
            kind, args = loop.send(reply)
            if kind == "start":
                reply = start(seed=seed, options=options)
            elif kind == "agent_reset":
                reply = agent.reset(*args)
            elif kind == "act":
                reply = agent.act(*args)
            else:
                out = step(*args)
                reply = (out, observation())
    except StopIteration as done:
        return done.value


async def aplay(target: Any, agent: Any, *, seed: int | None = None, options: dict[str, Any] | None = None,
                executor: Executor | None = None, should_stop: Callable[[], bool] | None = None,
                on_turn: Callable[[int, dict[str, Any]], None] | None = None) -> Played:
    """`play` under asyncio: the judge (and a synchronous agent's calls) run in `executor`, an async agent's
    `reset`/`act` are awaited, and the event loop stays free for other episodes."""
    start, step, observation = _target_ops(target)
    run = asyncio.get_running_loop().run_in_executor

    async def call(fn: Callable[..., Any], *args: Any) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        return await run(executor, fn, *args)

    loop = turn_loop(should_stop=should_stop, on_turn=on_turn, label=lambda: target.task.id)
    reply: Any = None
    try:
        while True:
            kind, args = loop.send(reply)
            if kind == "start":
                reply = await run(executor, functools.partial(start, seed=seed, options=options))
            elif kind == "agent_reset":
                reply = await call(agent.reset, *args)
            elif kind == "act":
                reply = await call(agent.act, *args)
            else:
                out = await run(executor, step, *args)
                reply = (out, observation())
    except StopIteration as done:
        return done.value
