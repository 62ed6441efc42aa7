"""Many episodes at once under asyncio: agents are coroutines (an LLM rollout awaits its model calls), the judge
runs in threads, and a few envs (each reused across episodes, optionally borrowing from a SandboxPool) serve a
queue of episode requests.

    async def main():
        async with EpisodePool(lambda req: MyAsyncAgent(), concurrency=8, env_kwargs={"max_turns": 4}) as pool:
            outcomes = await pool.run(["p2p/ring_shift", "collective/allreduce_ring"] * 16)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..agents.base import Agent  # noqa: F401 - named in AgentFactory
from ..episode.gym_env import CommBenchEnv
from ..episode.play import aplay
from ..errors import SandboxError
from .infra import InfraPolicy
from ..sandbox.pool import SandboxPool


@runtime_checkable
class AsyncAgent(Protocol):
    """Plays one episode: `reset` with the first observation, then `act` until the episode ends."""

    async def reset(self, observation: dict[str, Any], info: dict[str, Any]) -> None: ...

    async def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class EpisodeRequest:
    """One episode to play. `tag` is the caller's (e.g. the prompt group of a GRPO batch)."""

    task: str
    world_size: int | None = None
    seed: int | None = None
    tag: Any = None


@dataclass
class StepRecord:
    turn: int
    tool: str | None
    verdict: str | None
    reward: float
    started: float  # time.monotonic()
    ended: float


@dataclass
class EpisodeOutcome:
    request: EpisodeRequest
    index: int
    task_id: str = ""
    world_size: int = 0
    turns: int = 0
    final_reward: float = 0.0
    rewards: list[float] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    verdict: str | None = None
    trace_path: str | None = None
    sandbox: dict[str, Any] | None = None  # pooled: {"id", "gpus", "ports"} of the sandbox at reset
    started: float = 0.0  # time.monotonic()
    ended: float = 0.0
    attempts: int = 0
    error: str | None = None  # an infrastructure failure that outlived the retries (never the agent's fault)
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


AgentFactory = Callable[[EpisodeRequest], "AsyncAgent | Agent"]


class EpisodePool:
    """Runs episode requests with `concurrency` episodes in flight, each on its own env (made once per worker and
    reused: its sandbox's judge stays warm). `agent(request)` makes the agent of one episode: an AsyncAgent, or a
    synchronous Agent (run in threads). With `sandbox_pool`, envs borrow sandboxes from it (disjoint GPUs and
    ports, recycling, utilisation figures); without, each env owns one sandbox. An episode that hits an
    infrastructure failure (SandboxError) is replayed up to `infra_retries` times on a fresh sandbox.
    """

    def __init__(self, agent: AgentFactory, *, concurrency: int = 4, env_kwargs: dict[str, Any] | None = None,
                 sandbox_pool: SandboxPool | None = None, infra_retries: int = 1):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.agent_factory = agent
        self.concurrency = concurrency
        self.env_kwargs = dict(env_kwargs or {})
        self.sandbox_pool = sandbox_pool
        self.infra_retries = infra_retries
        # judge calls and synchronous agents: one thread per episode in flight, plus one for each one's agent
        self._executor = ThreadPoolExecutor(max_workers=2 * concurrency, thread_name_prefix="commbench-episode")
        self._envs: list[CommBenchEnv] = []

    # -- running ---------------------------------------------------------------------------------------------
    async def run(self, requests: Iterable[EpisodeRequest | str]) -> list[EpisodeOutcome]:
        """Play every request; outcomes in request order."""
        out: dict[int, EpisodeOutcome] = {}
        async for o in self.stream(requests):
            out[o.index] = o
        return [out[i] for i in sorted(out)]

    async def stream(self, requests: Iterable[EpisodeRequest | str]) -> AsyncIterator[EpisodeOutcome]:
        """Play every request; yield outcomes as episodes finish (a trainer can consume them as they come)."""
        queue: asyncio.Queue[tuple[int, EpisodeRequest] | None] = asyncio.Queue()
        n = 0
        for i, r in enumerate(requests):
            queue.put_nowait((i, r if isinstance(r, EpisodeRequest) else EpisodeRequest(task=r)))
            n += 1
        done: asyncio.Queue[EpisodeOutcome | BaseException] = asyncio.Queue()
        workers = [asyncio.create_task(self._worker(queue, done)) for _ in range(min(self.concurrency, n))]
        for _ in workers:
            queue.put_nowait(None)
        try:
            for _ in range(n):
                item = await done.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _worker(self, queue: asyncio.Queue, done: asyncio.Queue) -> None:
        env: CommBenchEnv | None = None
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                index, req = item
                try:
                    env, outcome = await self._episode(env, index, req)
                except Exception as exc:  # noqa: BLE001 - a card or agent error: stop the run and say so
                    await done.put(exc)
                    return
                await done.put(outcome)
        finally:
            if env is not None:
                self._envs.remove(env)
                await env.aclose(executor=self._executor)

    async def _new_env(self, req: EpisodeRequest) -> CommBenchEnv:
        # made on the first request's task, so that its device mode is the one checked against the sandbox's (the
        # env's default task may not run there); later episodes reset it onto theirs
        kwargs = {**self.env_kwargs, "task": req.task}
        if self.sandbox_pool is not None:
            kwargs["sandbox_pool"] = self.sandbox_pool
        env = await asyncio.get_running_loop().run_in_executor(self._executor, lambda: CommBenchEnv(**kwargs))
        self._envs.append(env)
        return env

    async def _episode(self, env: CommBenchEnv | None, index: int,
                       req: EpisodeRequest) -> tuple[CommBenchEnv | None, EpisodeOutcome]:
        outcome = EpisodeOutcome(request=req, index=index, started=time.monotonic())
        policy = InfraPolicy(self.infra_retries)
        for outcome.attempts in policy.attempts():
            if env is None:
                env = await self._new_env(req)
            try:
                await self._play(env, req, outcome)
                outcome.error = None
                break
            except SandboxError as exc:
                outcome.error = policy.describe(exc)
                self._envs.remove(env)
                partial = env.trace_path
                await env.aclose(executor=self._executor)  # a fresh env (and sandbox) for the retry
                env = None
                policy.discard(partial)  # an infrastructure failure is never scored as the agent's
        outcome.ended = time.monotonic()
        return env, outcome

    async def _play(self, env: CommBenchEnv, req: EpisodeRequest, outcome: EpisodeOutcome) -> None:
        agent = self.agent_factory(req)
        options: dict[str, Any] = {"task": req.task}
        if req.world_size is not None:
            options["world_size"] = req.world_size
        outcome.steps, outcome.rewards = [], []

        try:
            played = await aplay(env, agent, seed=req.seed, options=options, executor=self._executor)
        finally:
            close = getattr(agent, "close", None)
            if close is not None:
                res = close() if asyncio.iscoroutinefunction(close) else \
                    asyncio.get_running_loop().run_in_executor(self._executor, close)
                await res
        info, last = played.info, played.last
        outcome.task_id, outcome.world_size = info["task_id"], info["world_size"]
        outcome.trace_path, outcome.sandbox = info.get("trace_path"), info.get("sandbox")
        outcome.steps = [StepRecord(turn=t.outcome.turn, tool=t.outcome.tool, verdict=t.outcome.verdict,
                                    reward=t.outcome.reward, started=t.started, ended=t.ended) for t in played.turns]
        outcome.rewards = played.rewards
        outcome.turns = last.turn
        outcome.final_reward = float(last.episode_reward)
        outcome.turn_rewards = list(last.turn_rewards or outcome.rewards)
        outcome.verdict = last.verdict

    # -- lifetime ----------------------------------------------------------------------------------------------
    async def aclose(self) -> None:
        for env in list(self._envs):
            await env.aclose(executor=self._executor)
        self._envs.clear()
        self._executor.shutdown(wait=True)

    async def __aenter__(self) -> EpisodePool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
