"""The episode core: one task, several turns, each judged in a sandbox, rewarded and traced.

Every driver plays episodes through `Episode`: the Gymnasium env (gym_env.py) is an adapter over it (spaces, seeding,
the step tuple), and the runner, the scorers, the rollout pool, Ray and the trainers read its typed
`StepOutcome` instead of keys of `info`. An outcome holds both sides of the trust line: what the agent may see
(`feedback`, and `info()`, built from the result's `public()` view) and what only the host keeps (the full
`result`, with hidden cases).
"""

from __future__ import annotations

import json
import string
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gymnasium.error import ResetNeeded
from pydantic import Field

from .actions import ACTION_HELP, TOOL_TO_MODE, TOOLS, ParseError, parse_action
from ..cards import Task, load_task, select_tasks
from ..config import StrictModel
from ..errors import CardError, SandboxError
from ..judge.host.client import JudgeClient, require_gpus
from ..judge.host.feedback import render_targets
from ..judge.host.result import JudgeResult, SizeResult
from ..paths import cache_dir
from ..score.reference import reference_figures
from ..score.reward import (RewardBreakdown, RewardConfig, RewardSchedule, TurnCredit, TurnRewardConfig,
                            compute_reward)
from ..sandbox import Sandbox, SandboxProfile, load_profile, open_sandbox
from ..sandbox.gpus import GpuLease, lock_ids
from ..trace.records import EpisodeEnd, EpisodeStart, TraceAction, TraceStep, TurnMeta, new_trace_path
from ..trace.versions import episode_versions
from .hooks import EpisodeHook, TraceRecorder

if TYPE_CHECKING:
    from ..sandbox.pool import SandboxPool, Slot

CHARSET = string.printable  # spaces.Text's default is alphanumeric only
MAX_OBS_CHARS = 100_000
_ASCII = {"\u2014": "--", "\u2013": "-", "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00d7": "x",
          "\u2026": "...", "\u2192": "->", "\u2264": "<=", "\u2265": ">=", "\u00b5": "u"}
_ALLOWED = frozenset(CHARSET)


def to_charset(text: str, limit: int = MAX_OBS_CHARS) -> str:
    """Text inside the observation space: printable ASCII, common Unicode mapped, the rest as '?'."""
    out = "".join(c if c in _ALLOWED else _ASCII.get(c, "?") for c in text)
    return out if len(out) <= limit else out[: limit - 30] + "\n[... cut ...]"


def _action_text(action: Any, limit: int = 2000) -> str:
    """An unreadable action, as text for the trace, whatever it is (deep nesting and odd objects included)."""
    try:
        text = action if isinstance(action, str) else str(action)
    except Exception:  # noqa: BLE001 - str() of an agent's object may raise anything
        text = f"<{type(action).__name__} that cannot be shown>"
    return text[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


def _turn_meta(meta: dict[str, Any]) -> TurnMeta:
    """The agent's meta as the trace records it (plain JSON; the action parser bounded its size). Usage figures that
    are not numbers are kept under `agent_<name>` instead of failing the turn."""
    plain = json.loads(json.dumps(meta, default=str))
    try:
        return TurnMeta.model_validate(plain)
    except ValueError:
        renamed = {("agent_" + k if k in TurnMeta.model_fields else k): v for k, v in plain.items()}
        try:
            return TurnMeta.model_validate(renamed)
        except ValueError:
            return TurnMeta(agent_meta=json.dumps(plain)[:4000])


class EpisodeConfig(StrictModel):
    task: str = "collective/allreduce_ring"
    tasks: str | list[str] | None = Field(
        default=None, description="a task selector ('smoke', 'p2p', globs, ids) or a list of ids: every reset "
        "without options['task'] draws one with the env's seeded RNG")
    sandbox: str = "local-cpu"
    max_turns: int = Field(default=8, ge=1)
    world_size: int | None = Field(default=None, description="default: the card's default world size")
    reward: RewardConfig = Field(default_factory=RewardConfig)
    turn_reward: TurnRewardConfig = Field(default_factory=TurnRewardConfig,
                                          description="how rewards are spread over turns (see score/reward.py)")
    terminate_on_solve: bool = Field(default=False, description="end the episode when a check passes")
    submit_on_truncation: bool = Field(default=True, description="score the last code when turns run out")
    reference: Literal["cached", "interleaved", "none"] = Field(
        default="cached", description="reference timing: cached per hardware, re-measured each final step, or none")
    trace_dir: str | None = Field(default=None, description="where traces go; default ~/.cache/commbench/traces")
    feedback_chars: int = 6000
    hints: bool = Field(default=False, description="show each task's design hints (hints.md) after its statement; "
                        "recorded in the trace's config, and reports say which runs had them")
    check_worlds: int = Field(default=2, ge=1, description="world sizes a passing check or submission is judged at: "
                              "the episode's, then others of the card (one not a power of two where it lists one)")
    static_check: bool = True


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


class Episode:
    """One task at a time, turn by turn. `start` begins an episode (a sandbox ready, its trace opened), `step`
    plays one turn, `close` ends everything. Owns a sandbox, or borrows one from a SandboxPool."""

    def __init__(self, task: str | Task = "collective/allreduce_ring", sandbox: str | SandboxProfile | None = None,
                 max_turns: int = 8, world_size: int | None = None, reward: RewardConfig | dict | None = None,
                 agent: dict | None = None, sandbox_pool: SandboxPool | dict | None = None,
                 hooks: Sequence[EpisodeHook] = (),
                 reward_schedule: Callable[[TurnRewardConfig], RewardSchedule] = TurnCredit, **options: Any):
        self._hooks: list[EpisodeHook] = list(hooks)
        self._schedule = reward_schedule
        self._pool, self._owns_pool = self._make_pool(sandbox_pool, sandbox)
        if sandbox is None:
            sandbox = self._pool.profile if self._pool is not None else "local-cpu"
        reward_cfg = reward if isinstance(reward, RewardConfig) else RewardConfig.model_validate(reward or {})
        self.config = EpisodeConfig(task=task.id if isinstance(task, Task) else task,
                                sandbox=sandbox.name if isinstance(sandbox, SandboxProfile) else sandbox,
                                max_turns=max_turns, world_size=world_size, reward=reward_cfg, **options)
        self.profile = sandbox if isinstance(sandbox, SandboxProfile) else load_profile(sandbox)
        if self._pool is not None and self._pool.profile.name != self.profile.name:
            raise CardError(f"sandbox {self.profile.name!r} differs from the pool's profile "
                            f"{self._pool.profile.name!r}; leave sandbox= out when passing sandbox_pool=")
        self.agent_info = agent or {}
        self.task_ids = self._resolve_tasks(self.config.tasks)
        if self.task_ids and not isinstance(task, Task) and task not in self.task_ids:
            task = self.task_ids[0]
        self.task = task if isinstance(task, Task) else load_task(task)
        self.world_size = (self._world_for(self.task, self.config.world_size) if self.task_ids
                           else self._pick_world(self.config.world_size))
        self._sandbox: Sandbox | None = None
        self._judge: JudgeClient | None = None
        self._gpu_ids: dict[int, list[int]] = {}  # world size -> the GPUs a judge run of the own sandbox locks
        self._slot: Slot | None = None
        self._recycle: str | None = None
        self._recorders: list[EpisodeHook] = []
        self._recording = False  # an episode is open: its start record went out, its end record not yet
        self._trace_lock = threading.Lock()  # close() may come from another thread (a run being stopped)
        self.trace_path: Path | None = None
        self._closed = False
        self._reset_state()

    # -- helpers ---------------------------------------------------------------------------------------
    @staticmethod
    def _make_pool(pool: Any, sandbox: Any) -> tuple[SandboxPool | None, bool]:
        if pool is None:
            return None, False
        from ..sandbox.pool import SandboxPool

        if isinstance(pool, SandboxPool):
            return pool, False
        if isinstance(pool, dict):
            settings = dict(pool)
            settings.setdefault("profile", sandbox if sandbox is not None else "local-cpu")
            return SandboxPool(**settings), True
        raise TypeError(f"sandbox_pool must be a SandboxPool or a dict of its settings, not {type(pool).__name__}")

    def _resolve_tasks(self, tasks: str | list[str] | None) -> list[str]:
        if tasks is None:
            return []
        ids = [t.id for t in select_tasks(tasks)] if isinstance(tasks, str) else list(dict.fromkeys(tasks))
        if not ids:
            raise CardError(f"tasks={tasks!r} selects no task")
        mode = self.profile.device_mode
        for tid in ids:
            modes = [m.value for m in load_task(tid).card.world.device_modes]
            if mode not in modes:
                raise CardError(f"tasks={tasks!r}: task {tid} runs in device modes {modes}; sandbox profile "
                                f"{self.profile.name!r} is {mode!r}")
        return ids

    @staticmethod
    def _world_for(task: Task, requested: int | None) -> int:
        """For drawn tasks: the requested world size where the task allows it, else the task's default."""
        return task.world_for(requested)

    def _check_device_mode(self) -> None:
        modes = [m.value for m in self.task.card.world.device_modes]
        if self.profile.device_mode not in modes:
            raise CardError(f"task {self.task.id} runs in device modes {modes}; sandbox profile {self.profile.name!r} "
                            f"is {self.profile.device_mode!r}")

    def _pick_world(self, requested: int | None) -> int:
        self._check_device_mode()
        sizes = self.task.card.world.sizes
        if requested is None:
            return self.task.card.world.default_size
        if requested not in sizes:
            raise CardError(f"task {self.task.id} runs at world sizes {sizes}, not {requested}")
        return requested

    def _reset_state(self) -> None:
        self.turn = 0
        self.last_files: dict[str, str] = {}
        self.feedback = ""
        self.done = False
        self.last_result: JudgeResult | None = None
        self.last_outcome: StepOutcome | None = None
        self.episode_reward = 0.0
        self.final_reward: float | None = None
        self.credit: RewardSchedule = self._schedule(self.config.turn_reward)
        self.t_episode = time.monotonic()

    def observation(self) -> dict[str, Any]:
        """The current observation (what reset and step return)."""
        return {"task": to_charset(self._task_view()), "feedback": to_charset(self.feedback), "turn": self.turn}

    def _task_view(self) -> str:
        return self.task.agent_view(hints=self.config.hints, check_worlds=self.config.check_worlds)

    def _ensure_sandbox(self, fresh: bool) -> None:
        if self._sandbox is not None and (fresh or not self._sandbox.alive):
            self._close_sandbox()
        if self._sandbox is None:
            self._sandbox = open_sandbox(self.profile)
            self._sandbox.start()
            self._judge = JudgeClient(self._sandbox)

    def _close_sandbox(self) -> None:
        if self._judge is not None:
            self._judge.close()
        if self._sandbox is not None:
            self._sandbox.close()
        self._judge, self._sandbox = None, None

    def _finish_trace(self, verdict: str | None) -> None:
        """The trace's end record. An episode closed or reset before it ended is `interrupted`: no final verdict
        and no reward, whatever its last check said (a resumed run plays it again)."""
        with self._trace_lock:
            recording, self._recording = self._recording, False
        if recording:
            record = EpisodeEnd(status="finished" if self.done else "interrupted", reward=self.final_reward or 0.0,
                                episode_return=self.episode_reward, turn_rewards=self.credit.turn_rewards(),
                                turns=self.turn, final_verdict=verdict if self.done else None,
                                duration_s=time.monotonic() - self.t_episode)
            for hook in self._recorders:
                hook.on_end(self, record)

    # -- pooled sandboxes ----------------------------------------------------------------------------------
    def _slot_info(self) -> dict[str, Any] | None:
        s = self._slot
        return {"id": s.id, "gpus": list(s.gpus), "ports": list(s.ports)} if s is not None else None

    def _release_slot(self, recycle: str | None = None, episode_end: bool = True) -> None:
        slot, self._slot = self._slot, None
        reason, self._recycle = recycle or self._recycle, None
        if slot is not None and self._pool is not None:
            self._pool.release(slot, recycle=reason, episode_end=episode_end)

    @contextmanager
    def _gpu_turn(self) -> Iterator[None]:
        """The GPUs of the env's own sandbox, held for one judge run (a lock file per GPU, the leases SandboxPool
        uses): concurrent episodes on this host never time calls beside each other. Held per run, not per episode,
        so no episode waits on one that is itself waiting on its trainer's next batch."""
        ids = self._gpu_ids.get(self.world_size)
        if ids is None:  # fixed for a world size; lock_ids may ask nvidia-smi, so once, not at every judge run
            ids = self._gpu_ids[self.world_size] = lock_ids(self.profile, self.world_size)
        lease = GpuLease.acquire(len(ids), pool=ids) if ids else None
        try:
            yield
        finally:
            if lease is not None:
                lease.release()

    @contextmanager
    def _judging(self) -> Iterator[JudgeClient]:
        """The judge for this step: the env's own, or a pooled sandbox's (kept for the episode, or for this turn
        with hold="turn"). A SandboxError recycles the pooled sandbox; the next step borrows another."""
        if self._pool is None:
            with self._gpu_turn():
                yield self._judge  # type: ignore[misc]
            return
        if self._slot is None:
            self._slot = self._pool.acquire(self.world_size)
        try:
            yield self._slot.judge
        except SandboxError as exc:
            self._release_slot(recycle=f"infrastructure: {str(exc)[:200]}", episode_end=False)
            raise
        if self.done or self._pool.hold == "turn":
            self._release_slot(episode_end=self.done)

    def _evaluate(self, judge: JudgeClient, files: dict[str, str], mode: str) -> JudgeResult:
        result = judge.evaluate(self.task, files, mode, self.world_size,  # type: ignore[arg-type]
                                static_check=self.config.static_check, worlds=self.config.check_worlds)
        if self._pool is not None and self._recycle is None:
            from ..sandbox.pool import recycle_reason

            self._recycle = recycle_reason(result)
        return result

    # -- the episode ---------------------------------------------------------------------------------------
    def start(self, *, seed: int | None = None, options: dict[str, Any] | None = None,
              rng: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Begin an episode (the observation and info Gymnasium's reset returns). `options`: `task`,
        `world_size`; without a task, one of `tasks` is drawn with `rng` (a numpy Generator)."""
        if self._closed:
            raise ResetNeeded("the env was closed; make a new one")
        if self._recording:
            self._finish_trace(self.last_result.verdict.value if self.last_result else None)
        self._release_slot()  # an episode left unfinished gives its pooled sandbox back
        options = options or {}
        if "task" in options and options["task"] != self.task.id:
            self.task = load_task(options["task"])
            self.world_size = self._pick_world(options.get("world_size", self.config.world_size))
        elif "task" not in options and self.task_ids:
            if rng is None:
                import numpy as np

                rng = np.random.default_rng(seed)
            drawn = self.task_ids[int(rng.integers(len(self.task_ids)))]
            if drawn != self.task.id:
                self.task = load_task(drawn)
            self.world_size = self._world_for(self.task, options.get("world_size", self.config.world_size))
        elif "world_size" in options:
            self.world_size = self._pick_world(options["world_size"])
        self._reset_state()
        if self._pool is None:
            self._ensure_sandbox(fresh=self.profile.fresh_per_episode)
            hardware = self._sandbox.hardware()  # type: ignore[union-attr]
        elif self._pool.hold == "episode":
            self._slot = self._pool.acquire(self.world_size)
            hardware = self._slot.sandbox.hardware()
        else:
            hardware = self._pool.hardware(self.world_size)
        require_gpus(self.task, self.profile.device_mode, self.world_size, hardware, self.profile.name)
        trace_dir = Path(self.config.trace_dir) if self.config.trace_dir else cache_dir() / "traces"
        self.trace_path, episode_id = new_trace_path(trace_dir, self.task.id)
        start = EpisodeStart(
            episode_id=episode_id, task_id=self.task.id, task_hash=self.task.hash,
            task_card=self.task.card.model_dump(mode="json", exclude={"cases"}),
            task_view=self._task_view(),
            sandbox=self.profile.model_dump(mode="json"), hardware=hardware.model_dump(mode="json"),
            agent=self.agent_info, sandbox_slot=self._slot_info(),
            config={**self.config.model_dump(mode="json"), "world_size": self.world_size}, seed=seed,
            versions=episode_versions(self.profile, hardware, self._slot.sandbox if self._slot else self._sandbox,
                                      link_model=self.task.link_model(self.profile.link_model)))
        self._recorders = [TraceRecorder(), *self._hooks]  # a fresh trace writer per episode
        for hook in self._recorders:
            hook.on_start(self, start)
        self._recording = True
        info = {"task_id": self.task.id, "task_hash": self.task.hash, "world_size": self.world_size,
                "trace_path": str(self.trace_path), "tools": list(TOOLS)}
        if self._slot is not None:
            info["sandbox"] = self._slot_info()
        return self.observation(), info

    def step(self, action: Any) -> StepOutcome:
        """One turn of the episode: the action parsed, judged if it holds code, rewarded, traced."""
        if self._closed:
            raise ResetNeeded("the env was closed; make a new one")
        if self.done or not self._recording:
            raise ResetNeeded("the episode is over; call reset()")
        self.turn += 1
        t0 = time.monotonic()
        terminated, result, parts = False, None, None
        final: float | None = None
        parse_error: str | None = None
        try:
            act = parse_action(action, self.task.card.entry.file, self.task.card.language.value)
        except ParseError as exc:
            act = None
            self.feedback = f"Could not parse the action: {exc}\n{ACTION_HELP}"
            parse_error = str(exc)
        files = (act.files or self.last_files) if act is not None else {}
        if act is not None:
            unsupported = self.task.unsupported(TOOL_TO_MODE[act.tool])
            if not files:
                self.feedback = f"No source yet: send the text of {self.task.card.entry.file} in 'source'."
            elif unsupported:
                # the agent's slip, not the judge's: answered here, without a judge run (the judge client refuses
                # it, and a pooled sandbox must not be recycled for it); the code is kept as the latest
                self.last_files = dict(files)
                self.feedback = unsupported
                files = {}
        truncated_now = self.turn >= self.config.max_turns
        needs_judge = bool(files) or (truncated_now and self.config.submit_on_truncation and bool(self.last_files))
        slot = None
        try:
            with self._judging() if needs_judge else nullcontext() as judge:
                slot = self._slot_info()
                if act is not None and files:
                    self.last_files = dict(files)
                    mode = TOOL_TO_MODE[act.tool]
                    result = self._evaluate(judge, files, mode)
                    terminated = act.tool == "submit" or (self.config.terminate_on_solve and result.correct)
                    if terminated and mode != "full":
                        result = self._evaluate(judge, files, "full")
                    if terminated:
                        parts = self._final_reward(judge, result)
                        final = parts.reward
                    else:
                        parts = compute_reward(result, None, self.config.reward)
                    self.feedback = result.feedback(self.config.feedback_chars)
                    if result.benchmark and (terminated or mode == "benchmark"):
                        self.feedback += self._targets(judge, result)
                    if terminated:
                        self.feedback += (f"\n\nSubmitted. Reward {final:.3f}" + (f" ({parts.note})" if parts.note else "")
                                          + (f"; {parts.roofline_share:.0%} of the roofline (speed of light)"
                                             if parts.roofline_share is not None else ""))
                truncated = not terminated and truncated_now
                if truncated and self.config.submit_on_truncation and self.last_files:
                    result = self._evaluate(judge, self.last_files, "full")
                    parts = self._final_reward(judge, result)
                    final = parts.reward
                    self.feedback += f"\n\nTurn budget used up; your last code was scored: reward {final:.3f}"
                self.done = terminated or truncated
        except BaseException:  # the infrastructure failed (or the run was interrupted), not the agent:
            self.turn -= 1  # this turn did not happen
            raise
        if self.done and final is None:
            final = 0.0  # the episode ended unscored
        score = parts.reward if parts is not None else None
        reward = self.credit.step(score, final if self.done else None)
        self.episode_reward += reward
        if self.done:
            self.final_reward = final
        if result is not None:
            self.last_result = result
        # the outcome's info() holds what the agent may see (hidden cases by number, no values); the full result
        # goes to the trace and stays on the host (`last_outcome.result`, `last_result`)
        outcome = StepOutcome(
            turn=self.turn, feedback=to_charset(self.feedback), reward=float(reward), terminated=terminated,
            truncated=truncated, tool=act.tool if act else None, result=result, parts=parts,
            turn_score=self.credit.scores[-1], final_reward=final if self.done else None,
            turn_rewards=self.credit.turn_rewards() if self.done else None, parse_error=parse_error,
            sandbox=slot, step_s=time.monotonic() - t0,
            context={"task_id": self.task.id, "task_hash": self.task.hash, "trace_path": str(self.trace_path)})
        self.last_outcome = outcome
        if not self._recording:  # closed meanwhile (a run being stopped): this turn is not recorded as played
            raise SandboxError("the env was closed while this step ran")
        record = TraceStep(
            turn=self.turn, action=TraceAction(tool=outcome.tool, files=act.files if act else {},
                                               raw=None if act else _action_text(action)),
            meta=_turn_meta(act.meta if act else {}), observation=outcome.feedback, judge_result=result,
            reward=outcome.reward, reward_parts=parts, turn_score=outcome.turn_score, sandbox_slot=slot,
            terminated=terminated, truncated=truncated, step_s=outcome.step_s, error=parse_error)
        for hook in self._recorders:
            hook.on_step(self, outcome, record)
        if self.done:
            self._finish_trace(result.verdict.value if result else None)
            self._release_slot()
        return outcome

    def _final_reward(self, judge: JudgeClient, result: JudgeResult) -> RewardBreakdown:
        ref: list[SizeResult] | None = None
        if result.correct and self.config.reference != "none":
            ref = self._reference(judge, refresh=self.config.reference == "interleaved")
        return compute_reward(result, ref, self.config.reward)

    def _reference(self, judge: JudgeClient, refresh: bool = False) -> list[SizeResult]:
        """The expert reference's figures on this hardware (cached on disk per hardware and limits, reference.py)."""
        return reference_figures(judge, self.task, self.world_size, refresh=refresh)

    def _targets(self, judge: JudgeClient, result: JudgeResult) -> str:
        """The reference's time per size beside the agent's: what a benchmark turn is measured against."""
        if self.config.reference == "none":
            return ""
        return render_targets(result.benchmark, self._reference(judge), result.metric)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finish_trace(self.last_result.verdict.value if self.last_result else None)
        self._close_sandbox()
        self._release_slot()
        if self._owns_pool and self._pool is not None:
            self._pool.close()

