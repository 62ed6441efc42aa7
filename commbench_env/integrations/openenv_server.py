"""CommBench as an OpenEnv environment server: the door for OpenEnv consumers (TRL, SkyRL, NeMo Gym, verifiers).

OpenEnv (`openenv-core`) owns the protocol: `HTTPEnvServer` serves `/ws` (one persistent session per WebSocket,
which its `EnvClient` speaks), the stateless `/reset`, `/step` and `/state`, and `/schema`, `/metadata`, `/health`.
This module adds only what is CommBench's: typed action, observation and state models, and an `Environment` that
is a thin adapter over `episode.Episode`, so the turns, judging, rewards and traces are the ones every other
driver gets. Each session has its own Episode; they borrow sandboxes from one `SandboxPool`.

What goes over the wire is the agent's view only: the task statement, the feedback, and `StepOutcome.info()`, whose
judge result is `JudgeResult.public()` (hidden cases by number, no values); paths on the server host are left out.
Rewards are computed on the server.

    commbench serve --port 8000                      # then, from any OpenEnv client:
    with CommBenchClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(task="p2p/ring_shift", world_size=2)
        result = env.step(CommBenchAction(tool="check", source=code))

OpenEnv's stateless HTTP `/reset` and `/step` build a fresh environment per request (its design), so an episode of
several turns is played over the WebSocket session; a stateless `/step` is answered 409 with that advice.
"""

from __future__ import annotations

import functools
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from .. import __version__
from ..config import StrictModel
from ..episode.actions import ACTION_HELP, MAX_SOURCE_CHARS, TOOLS
from ..episode.core import Episode, StepOutcome
from ..errors import CommBenchError, SandboxError
from ..sandbox import load_profile
from ..sandbox.pool import SandboxPool


class OpenEnvMissing(CommBenchError, ImportError):
    """openenv-core is not installed (the `openenv` extra)."""


try:
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server import (Action, ConcurrencyConfig, Environment, Observation, State,
                                         create_fastapi_app)
    from openenv.core.env_server.types import EnvironmentMetadata
except ImportError as _exc:  # the core works without it; this door needs it
    raise OpenEnvMissing(f"the OpenEnv server needs openenv-core ({_exc}): "
                         "pip install 'commbench-env[openenv]'") from None

if TYPE_CHECKING:
    from fastapi import FastAPI

ToolName = Literal[TOOLS]  # type: ignore[valid-type]  # compile, check, benchmark, profile, submit, sanitize
RESET_OPTIONS = ("seed", "episode_id", "task", "world_size", "agent")


# -- the typed models on the wire ---------------------------------------------------------------------------
class CommBenchAction(Action):
    """One turn: a tool and the full text of the task's solution file (empty: the last code sent is reused).
    `metadata` (the agent's message, token usage, cost) is recorded in the trace, never judged."""

    tool: ToolName = Field(description="compile | check | benchmark | profile | submit | sanitize (CUDA tasks)")
    source: str = Field(default="", max_length=MAX_SOURCE_CHARS,
                        description="the full text of the solution file; empty reuses the last one")


class CommBenchObservation(Observation):
    """What the agent sees after reset or a step. `reward` is this turn's reward (0 on intermediate turns by
    default); `final_reward` the episode's, on its last turn. `judge_result` is the public view of the judge's
    result (hidden cases by number and pass/fail only)."""

    task: str = Field(description="the task statement, starter code and rules")
    feedback: str = Field(default="", description="the judge's feedback on the last action")
    turn: int = 0
    max_turns: int = 0
    task_id: str = ""
    task_hash: str = ""
    world_size: int = 0
    tools: list[str] = Field(default_factory=lambda: list(TOOLS))
    tool: str | None = None
    verdict: str | None = None
    terminated: bool = False
    truncated: bool = False
    judge_result: dict[str, Any] | None = Field(default=None, description="JudgeResult.public(), as JSON")
    reward_parts: dict[str, Any] | None = Field(default=None, description="every component of the reward")
    turn_score: float | None = None
    final_reward: float | None = None
    turn_rewards: list[float] | None = None
    parse_error: str | None = None
    sandbox: dict[str, Any] | None = Field(default=None, description="the pooled sandbox slot: id, GPUs, ports")
    step_s: float = 0.0


class CommBenchState(State):
    """The session's episode: which task, how far, and its reward so far."""

    task_id: str | None = None
    task_hash: str | None = None
    world_size: int | None = None
    sandbox_profile: str = ""
    device_mode: str = ""
    turn: int = 0
    max_turns: int = 0
    done: bool = False
    episode_return: float = 0.0
    final_reward: float | None = None
    last_verdict: str | None = None


class ServerSettings(StrictModel):
    """What `commbench serve` serves: one sandbox profile, the default task (or a selector to draw from), and
    the episode options every session gets."""

    sandbox: str = "local-cpu"
    max_sessions: int = Field(default=4, ge=1, description="concurrent WebSocket sessions")
    max_sandboxes: int | None = Field(default=None, ge=1, description="pooled sandboxes (default: max_sessions)")
    hold: Literal["episode", "turn"] = Field(
        default="episode", description="a session keeps its sandbox for the episode, or only while the judge runs")
    task: str = "collective/allreduce_ring"
    tasks: str | None = Field(default=None, description="a selector: resets without a task draw one (seeded)")
    max_turns: int = Field(default=8, ge=1)
    world_size: int | None = None
    reference: Literal["cached", "interleaved", "none"] = "cached"
    trace_dir: str | None = None
    session_timeout_s: float | None = Field(default=None, gt=0, description="idle sessions are closed after this")
    acquire_timeout_s: float = Field(default=600.0, gt=0, description="how long a reset waits for a free sandbox")


# -- the environment ----------------------------------------------------------------------------------------
class CommBenchEnvironment(Environment[CommBenchAction, CommBenchObservation, CommBenchState]):
    """One OpenEnv session: an `Episode` made at the first reset and reused by later ones, judging in sandboxes
    borrowed from the server's pool. Agent slips are observations (the Episode's rules); protocol misuse
    (a step before reset, unknown reset options) and infrastructure failures are errors with a message."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own Episode and its own pooled sandbox

    def __init__(self, settings: ServerSettings, pool: SandboxPool | None = None):
        super().__init__()
        self.settings = settings
        self._pool = pool
        self._episode: Episode | None = None
        self._episode_id: str | None = None
        self._steps = 0

    def _make_episode(self, task: str | None) -> Episode:
        s = self.settings
        kwargs: dict[str, Any] = {"tasks": s.tasks, "reference": s.reference}
        if s.trace_dir:
            kwargs["trace_dir"] = s.trace_dir
        return Episode(task or s.task, sandbox=None if self._pool is not None else s.sandbox,
                       max_turns=s.max_turns, world_size=s.world_size, sandbox_pool=self._pool, **kwargs)

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **options: Any) -> CommBenchObservation:
        """Begin an episode. Options: `task` (an id), `world_size`, `agent` (a dict recorded in the trace)."""
        unknown = sorted(set(options) - set(RESET_OPTIONS))
        if unknown:
            raise CommBenchError(f"unknown reset options {unknown}; allowed: {', '.join(RESET_OPTIONS)}")
        task, agent = options.get("task"), options.get("agent")
        if agent is not None and not isinstance(agent, dict):
            raise CommBenchError("reset option 'agent' must be a dict (it is recorded in the trace)")
        if self._episode is None:
            self._episode = self._make_episode(task)
        self._episode_id = episode_id or uuid.uuid4().hex
        self._episode.agent_info = {"client": "openenv", "episode_id": self._episode_id, **(agent or {})}
        start = {k: options[k] for k in ("task", "world_size") if options.get(k) is not None}
        try:
            self._episode.start(seed=seed, options=start)
        except SandboxError as exc:
            raise CommBenchError(f"infrastructure error, not the agent's fault: {exc}") from None
        self._steps = 0
        return self._observation(None)

    def step(self, action: CommBenchAction, timeout_s: float | None = None, **kwargs: Any) -> CommBenchObservation:
        """One turn, judged and rewarded on the server. `timeout_s` is not used: the sandbox profile's limits
        bound every judge run."""
        ep = self._episode
        if ep is None or self._episode_id is None:
            raise CommBenchError("no episode in this session: send reset first (an episode is played over one "
                                 "WebSocket session, /ws, as OpenEnv's EnvClient does; HTTP /step is stateless)")
        try:
            outcome = ep.step({"tool": action.tool, "source": action.source, "meta": action.metadata})
        except SandboxError as exc:
            raise CommBenchError(f"infrastructure error, not the agent's fault; the turn did not count and may be "
                                 f"sent again: {exc}") from None
        self._steps += 1
        return self._observation(outcome)

    def _observation(self, outcome: StepOutcome | None) -> CommBenchObservation:
        ep = self._episode
        assert ep is not None
        base = ep.observation()
        fields: dict[str, Any] = {"task": base["task"], "feedback": base["feedback"], "turn": base["turn"],
                                  "max_turns": ep.config.max_turns, "task_id": ep.task.id, "task_hash": ep.task.hash,
                                  "world_size": ep.world_size}
        if outcome is None:
            return CommBenchObservation(**fields, reward=None, done=False)
        info = outcome.info()  # the agent's view: the public judge result, the reward's parts
        info.pop("trace_path", None)  # a path on the server's host
        return CommBenchObservation(
            **fields, tool=info.get("tool"), verdict=info.get("verdict"), terminated=outcome.terminated,
            truncated=outcome.truncated, judge_result=info.get("judge_result"), reward_parts=info.get("reward_parts"),
            turn_score=info.get("turn_score"), final_reward=info.get("final_reward"),
            turn_rewards=info.get("turn_rewards"), parse_error=info.get("parse_error"), sandbox=info.get("sandbox"),
            step_s=outcome.step_s, reward=outcome.reward, done=outcome.done)

    @property
    def state(self) -> CommBenchState:
        ep = self._episode
        profile = self._pool.profile if self._pool is not None else load_profile(self.settings.sandbox)
        out = CommBenchState(episode_id=self._episode_id, step_count=self._steps, sandbox_profile=profile.name,
                             device_mode=profile.device_mode, max_turns=self.settings.max_turns)
        if ep is not None and self._episode_id is not None:
            out.task_id, out.task_hash, out.world_size = ep.task.id, ep.task.hash, ep.world_size
            out.turn, out.done, out.episode_return = ep.turn, ep.done, ep.episode_reward
            out.final_reward = ep.final_reward
            out.last_verdict = ep.last_result.verdict.value if ep.last_result else None
        return out

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="CommBench-Env", version=__version__,
            description="LLM agents write multi-GPU communication code; a judge compiles, runs, checks and times it "
                        f"in a sandbox. {ACTION_HELP}")

    def close(self) -> None:
        if self._episode is not None:
            self._episode.close()
            self._episode = None


# -- the server ---------------------------------------------------------------------------------------------
def create_server_app(settings: ServerSettings | None = None, pool: SandboxPool | None = None) -> FastAPI:
    """The OpenEnv FastAPI app for `settings` (cards and the profile checked now, so a wrong name fails at start,
    not at the first reset). Sandboxes come from `pool` (default: a new one, closed when the app shuts down)."""
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from gymnasium.error import ResetNeeded
    from starlette.websockets import WebSocketDisconnect

    settings = settings or ServerSettings()
    owns_pool = pool is None
    if pool is None:
        pool = SandboxPool(settings.sandbox, max_sandboxes=settings.max_sandboxes or settings.max_sessions,
                           hold=settings.hold, acquire_timeout_s=settings.acquire_timeout_s)
    elif pool.profile.name != load_profile(settings.sandbox).name:
        raise CommBenchError(f"the pool serves {pool.profile.name!r}, the settings name {settings.sandbox!r}")
    try:
        CommBenchEnvironment(settings, pool)._make_episode(None).close()  # validates task, selector, world, mode
    except BaseException:
        if owns_pool:
            pool.close()
        raise
    factory = functools.partial(CommBenchEnvironment, settings=settings, pool=pool)
    app = create_fastapi_app(factory, CommBenchAction, CommBenchObservation, concurrency_config=ConcurrencyConfig(
        max_concurrent_envs=settings.max_sessions, session_timeout=settings.session_timeout_s))

    async def refused(request: Request, exc: Exception) -> JSONResponse:  # protocol misuse: 409, not a 500
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    async def gone(websocket: Any, exc: Exception) -> None:
        """A client that closed its socket first: openenv 0.3 then fails to close it again and the server would
        log a traceback per session; its session is already closed and its sandbox given back."""

    app.add_exception_handler(CommBenchError, refused)
    app.add_exception_handler(ResetNeeded, refused)
    app.add_exception_handler(WebSocketDisconnect, gone)
    if owns_pool:
        app.router.on_shutdown.append(pool.close)
    app.state.commbench_pool = pool
    return app


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket on host:port (port 0: a free one, read back with getsockname)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CommBenchError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); pass --port 0 for a free "
                             "port") from None
    sock.listen(128)
    return sock


def _server(app: FastAPI, log_level: str) -> Any:
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on"))


def serve(settings: ServerSettings, host: str = "127.0.0.1", port: int = 8000, *,
          on_ready: Callable[[str], None] | None = None, log_level: str = "warning") -> None:
    """Serve until interrupted. `on_ready` gets the base URL (http://host:port) once the socket listens."""
    sock = bind(host, port)
    try:
        app = create_server_app(settings)
    except BaseException:
        sock.close()
        raise
    url = f"http://{host}:{sock.getsockname()[1]}"
    if on_ready is not None:
        on_ready(url)
    _server(app, log_level).run(sockets=[sock])


@contextmanager
def serve_in_thread(settings: ServerSettings | None = None, host: str = "127.0.0.1", *,
                    pool: SandboxPool | None = None, log_level: str = "warning",
                    start_timeout_s: float = 30.0) -> Iterator[str]:
    """A server on a free port of `host` in a background thread, for tests and notebooks: yields its base URL and
    stops it (sessions closed, pool closed if it made one) on exit."""
    sock = bind(host, 0)
    try:
        app = create_server_app(settings, pool)
    except BaseException:
        sock.close()
        raise
    server = _server(app, log_level)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="commbench-openenv", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise CommBenchError("the OpenEnv server did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


# -- the client ---------------------------------------------------------------------------------------------
class CommBenchClient(EnvClient[CommBenchAction, CommBenchObservation, CommBenchState]):
    """OpenEnv's WebSocket client with CommBench's types: actions are checked here before they are sent, and
    results come back as `CommBenchObservation` / `CommBenchState`. Any OpenEnv client (e.g. GenericEnvClient
    with plain dicts) talks to the same server. Use `.sync()` for blocking calls."""

    def _step_payload(self, action: CommBenchAction | dict[str, Any]) -> dict[str, Any]:
        act = action if isinstance(action, CommBenchAction) else CommBenchAction.model_validate(action)
        return act.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[CommBenchObservation]:
        obs = CommBenchObservation(**payload.get("observation", {}), reward=payload.get("reward"),
                                   done=payload.get("done", False))
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> CommBenchState:
        return CommBenchState.model_validate(payload)
