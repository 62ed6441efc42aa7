"""The Gymnasium environment: one task per episode, the agent's code judged in a sandbox every turn."""

from __future__ import annotations

import string
import time
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
from gymnasium import spaces
from pydantic import Field

from .actions import ACTION_HELP, MAX_SOURCE_CHARS, TOOL_TO_MODE, TOOLS, ParseError, parse_action
from .cards import Task, load_task
from .config import StrictModel
from .errors import CardError
from .judge.client import JudgeClient
from .judge.result import JudgeResult, SizeResult
from .paths import cache_dir
from .reference import reference_figures
from .reward import RewardBreakdown, RewardConfig, compute_reward
from .sandbox import Sandbox, SandboxProfile, load_profile, open_sandbox
from .trace import TRACE_SCHEMA, TraceWriter, new_trace_path

CHARSET = string.printable  # spaces.Text's default is alphanumeric only
MAX_OBS_CHARS = 100_000
_ASCII = {"\u2014": "--", "\u2013": "-", "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00d7": "x",
          "\u2026": "...", "\u2192": "->", "\u2264": "<=", "\u2265": ">=", "\u00b5": "u"}
_ALLOWED = frozenset(CHARSET)


def to_charset(text: str, limit: int = MAX_OBS_CHARS) -> str:
    """Text inside the observation space: printable ASCII, common Unicode mapped, the rest as '?'."""
    out = "".join(c if c in _ALLOWED else _ASCII.get(c, "?") for c in text)
    return out if len(out) <= limit else out[: limit - 30] + "\n[... cut ...]"


class EnvConfig(StrictModel):
    task: str = "collective/allreduce_ring"
    sandbox: str = "local-cpu"
    max_turns: int = Field(default=8, ge=1)
    world_size: int | None = Field(default=None, description="default: the card's default world size")
    reward: RewardConfig = Field(default_factory=RewardConfig)
    terminate_on_solve: bool = Field(default=False, description="end the episode when a check passes")
    submit_on_truncation: bool = Field(default=True, description="score the last code when turns run out")
    reference: Literal["cached", "interleaved", "none"] = Field(
        default="cached", description="reference timing: cached per hardware, re-measured each final step, or none")
    trace_dir: str | None = Field(default=None, description="where traces go; default ~/.cache/commbench/traces")
    feedback_chars: int = 6000
    static_check: bool = True


class CommBenchEnv(gym.Env):
    """Observation: {'task': statement, 'feedback': judge feedback, 'turn': n}. Action: {'tool', 'source'}.

    Reward is 0 on intermediate turns and the final reward (see reward.py) on the turn that terminates
    (submit, or a passing check with terminate_on_solve) or truncates (turn budget; the last code is scored).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, task: str | Task = "collective/allreduce_ring", sandbox: str | SandboxProfile = "local-cpu",
                 max_turns: int = 8, world_size: int | None = None, reward: RewardConfig | dict | None = None,
                 render_mode: str | None = None, agent: dict | None = None, **options: Any):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None")
        self.render_mode = render_mode
        reward_cfg = reward if isinstance(reward, RewardConfig) else RewardConfig.model_validate(reward or {})
        self.config = EnvConfig(task=task.id if isinstance(task, Task) else task,
                                sandbox=sandbox.name if isinstance(sandbox, SandboxProfile) else sandbox,
                                max_turns=max_turns, world_size=world_size, reward=reward_cfg, **options)
        self.profile = sandbox if isinstance(sandbox, SandboxProfile) else load_profile(sandbox)
        self.agent_info = agent or {}
        self.task = task if isinstance(task, Task) else load_task(task)
        self.world_size = self._pick_world(self.config.world_size)
        self.observation_space = spaces.Dict({
            "task": spaces.Text(max_length=MAX_OBS_CHARS, min_length=0, charset=CHARSET),
            "feedback": spaces.Text(max_length=MAX_OBS_CHARS, min_length=0, charset=CHARSET),
            "turn": spaces.Discrete(self.config.max_turns + 1),
        })
        self.action_space = spaces.Dict({
            "tool": spaces.Discrete(len(TOOLS)),
            "source": spaces.Text(max_length=MAX_SOURCE_CHARS, min_length=0, charset=CHARSET),
        })
        self._sandbox: Sandbox | None = None
        self._judge: JudgeClient | None = None
        self._trace: TraceWriter | None = None
        self.trace_path: Path | None = None
        self._closed = False
        self._reset_state()

    # -- helpers ---------------------------------------------------------------------------------------
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
        self.episode_reward = 0.0
        self.t_episode = time.monotonic()

    def _obs(self) -> dict[str, Any]:
        return {"task": to_charset(self.task.agent_view()), "feedback": to_charset(self.feedback), "turn": self.turn}

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
        if self._trace is not None:
            self._trace.write({"type": "episode_end", "reward": self.episode_reward, "turns": self.turn,
                               "final_verdict": verdict, "duration_s": time.monotonic() - self.t_episode})
            self._trace.close()
            self._trace = None

    # -- gymnasium API ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if self._closed:
            raise gym.error.ResetNeeded("the env was closed; make a new one")
        if self._trace is not None:
            self._finish_trace(self.last_result.verdict.value if self.last_result else None)
        options = options or {}
        if "task" in options and options["task"] != self.task.id:
            self.task = load_task(options["task"])
            self.world_size = self._pick_world(options.get("world_size", self.config.world_size))
        elif "world_size" in options:
            self.world_size = self._pick_world(options["world_size"])
        self._reset_state()
        self._ensure_sandbox(fresh=self.profile.fresh_per_episode)
        trace_dir = Path(self.config.trace_dir) if self.config.trace_dir else cache_dir() / "traces"
        self.trace_path, episode_id = new_trace_path(trace_dir, self.task.id)
        self._trace = TraceWriter(self.trace_path)
        self._trace.write({
            "type": "episode_start", "schema": TRACE_SCHEMA, "episode_id": episode_id, "task_id": self.task.id,
            "task_hash": self.task.hash, "task_card": self.task.card.model_dump(mode="json", exclude={"cases"}),
            "task_view": self.task.agent_view(), "sandbox": self.profile.model_dump(mode="json"),
            "hardware": self._sandbox.hardware().model_dump(), "agent": self.agent_info,
            "config": {**self.config.model_dump(mode="json"), "world_size": self.world_size}, "seed": seed,
        })
        return self._obs(), {"task_id": self.task.id, "task_hash": self.task.hash, "world_size": self.world_size,
                             "trace_path": str(self.trace_path), "tools": list(TOOLS)}

    def step(self, action: Any):
        if self._closed:
            raise gym.error.ResetNeeded("the env was closed; make a new one")
        if self.done or self._trace is None:
            raise gym.error.ResetNeeded("the episode is over; call reset()")
        self.turn += 1
        t0 = time.monotonic()
        info: dict[str, Any] = {"turn": self.turn, "task_id": self.task.id, "task_hash": self.task.hash,
                                "trace_path": str(self.trace_path)}
        reward, terminated, result, parts = 0.0, False, None, None
        try:
            act = parse_action(action, self.task.card.entry.file)
        except ParseError as exc:
            act = None
            self.feedback = f"Could not parse the action: {exc}\n{ACTION_HELP}"
            info["parse_error"] = str(exc)
        if act is not None:
            files = act.files or self.last_files
            info["tool"] = act.tool
            if not files:
                self.feedback = f"No source yet: send the text of {self.task.card.entry.file} in 'source'."
            else:
                self.last_files = dict(files)
                mode = TOOL_TO_MODE[act.tool]
                result = self._judge.evaluate(self.task, files, mode, self.world_size,  # type: ignore[union-attr]
                                              static_check=self.config.static_check)
                terminated = act.tool == "submit" or (self.config.terminate_on_solve and result.correct)
                if terminated and mode != "full":
                    result = self._judge.evaluate(self.task, files, "full", self.world_size,  # type: ignore[union-attr]
                                                  static_check=self.config.static_check)
                if terminated:
                    parts = self._final_reward(result)
                    reward = parts.reward
                else:
                    parts = compute_reward(result, None, self.config.reward)
                self.feedback = result.feedback(self.config.feedback_chars)
                if terminated:
                    self.feedback += f"\n\nSubmitted. Reward {reward:.3f}" + (f" ({parts.note})" if parts.note else "")
        truncated = not terminated and self.turn >= self.config.max_turns
        if truncated and self.config.submit_on_truncation and self.last_files:
            result = self._judge.evaluate(self.task, self.last_files, "full", self.world_size,  # type: ignore[union-attr]
                                          static_check=self.config.static_check)
            parts = self._final_reward(result)
            reward = parts.reward
            self.feedback += f"\n\nTurn budget used up; your last code was scored: reward {reward:.3f}"
        self.done = terminated or truncated
        self.episode_reward += reward
        if result is not None:
            self.last_result = result
        info.update({"judge_result": result.model_dump(mode="json") if result else None,
                     "reward_parts": parts.model_dump() if parts else None,
                     "verdict": result.verdict.value if result else None, "step_s": time.monotonic() - t0})
        obs = self._obs()
        self._trace.write({"type": "step", "turn": self.turn,
                           "action": {"tool": act.tool if act else None, "files": act.files if act else {},
                                      "raw": None if act else str(action)[:2000]},
                           "meta": act.meta if act else {}, "observation": obs["feedback"],
                           "judge_result": info["judge_result"], "reward": reward, "reward_parts": info["reward_parts"],
                           "terminated": terminated, "truncated": truncated, "step_s": info["step_s"],
                           "error": info.get("parse_error")})
        if self.done:
            self._finish_trace(result.verdict.value if result else None)
        return obs, float(reward), terminated, truncated, info

    def _final_reward(self, result: JudgeResult) -> RewardBreakdown:
        ref: list[SizeResult] | None = None
        if result.correct and self.config.reference != "none":
            ref = reference_figures(self._judge, self.task, self.world_size,  # type: ignore[arg-type]
                                    refresh=self.config.reference == "interleaved")
        return compute_reward(result, ref, self.config.reward)

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return f"turn {self.turn}/{self.config.max_turns} on {self.task.id}\n{self.feedback}"
        return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finish_trace(self.last_result.verdict.value if self.last_result else None)
        self._close_sandbox()
        super().close()
