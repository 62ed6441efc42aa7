"""Framework-neutral pieces of the trainer adapters: prompts built from task cards, and one tool-driven episode
with the rules every trainer needs (an infrastructure failure is never a score)."""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..agents.llm import SYSTEM_PROMPT, TOOL_SPECS
from ..cards import select_tasks
from ..errors import CommBenchError, SandboxError
from ..sandbox import load_profile

SINGLE_TURN_SYSTEM = (
    "You are an expert in GPU communication code (torch.distributed, NCCL, CUDA). Solve the task below in one "
    "answer: reply with the COMPLETE text of the solution file it names, in one fenced code block. Your code is "
    "judged on hidden cases, then timed against an expert reference."
)
MULTI_TURN_SYSTEM = SYSTEM_PROMPT  # the LLM agents' prompt: one tool call per turn, submit before the budget ends


def task_rows(tasks: str = "smoke", *, sandbox: str = "local-cpu", world_size: int | None = None, repeats: int = 1,
              multi_turn: bool = False) -> list[dict[str, Any]]:
    """One row per (task, repeat): `prompt` (chat messages: system + the task statement the agent sees), `task`
    (its id) and `world_size` (where the task allows `world_size`, else its default). `tasks` is a selector
    (`smoke`, `all`, a category, ids, globs); tasks that cannot run in the sandbox's device mode are left out."""
    rows = []
    for task in select_tasks(tasks, device_mode=load_profile(sandbox).device_mode):
        world = task.world_for(world_size)
        system = MULTI_TURN_SYSTEM if multi_turn else SINGLE_TURN_SYSTEM
        prompt = [{"role": "system", "content": system},
                  {"role": "user", "content": f"Task statement (world size {world}):\n\n{task.agent_view()}"}]
        rows += [{"prompt": prompt, "task": task.id, "world_size": world} for _ in range(repeats)]
    return rows


VERL_AGENT_NAME = "commbench"  # the name verl_adapter registers its agent loop under


def verl_rows(tasks: str = "smoke", *, sandbox: str = "local-cpu", world_size: int | None = None,
              repeats: int = 1) -> list[dict[str, Any]]:
    """Rows for verl's RLHFDataset: `prompt` (system + task statement), `agent_name` (CommBench's agent loop),
    `data_source`, a `reward_model` stub verl's schema expects, and `extra_info` with the task id, world size and
    row index. Building them needs no verl."""
    rows = []
    for i, row in enumerate(task_rows(tasks, sandbox=sandbox, world_size=world_size, repeats=repeats,
                                      multi_turn=True)):
        rows.append({"prompt": row["prompt"], "agent_name": VERL_AGENT_NAME, "data_source": "commbench",
                     "reward_model": {"style": "commbench-judge", "ground_truth": ""},
                     "extra_info": {"index": i, "task": row["task"], "world_size": row["world_size"]}})
    return rows


def write_rows(rows: Sequence[dict[str, Any]], path: str | Path, *, fmt: str | None = None) -> Path:
    """Write training rows as parquet (verl's `data.train_files`, `datasets`) or JSONL: `fmt`, else the file's
    suffix (.parquet or .jsonl)."""
    path = Path(path)
    fmt = fmt or path.suffix.lstrip(".")
    if fmt not in ("parquet", "jsonl"):
        raise CommBenchError(f"{path}: the file must end in .parquet or .jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path
    try:
        import pandas as pd

        pd.DataFrame(list(rows)).to_parquet(path)
    except ImportError as exc:  # pandas itself, or its parquet engine (pyarrow)
        raise CommBenchError(f"writing parquet needs pandas and pyarrow ({exc}): pip install 'commbench-env[verl]', "
                             "or write .jsonl") from None
    return path


def tool_schemas(task_id: str | None = None) -> list[dict]:
    """The env's tools as OpenAI function schemas (what chat templates render as the model's tools): compile,
    check, benchmark, profile and submit, plus sanitize for a CUDA task."""
    from ..cards import load_task

    tools = {"compile", "check", "benchmark", "profile", "submit"}
    if task_id and load_task(task_id).card.language.value == "cuda":
        tools.add("sanitize")
    return [{"type": "function", "function": spec} for spec in TOOL_SPECS if spec["name"] in tools]


class ToolEpisode:
    """One multi-turn episode driven by tool calls, for trainers: each `act` is one env step, and `final_reward`
    is the episode's reward (as submitted; else the last code scored as at truncation; no code at all: 0).

    A sandbox failure ends the episode with `infra_error` set and `final_reward` None: trainers must leave such a
    sample out rather than score it as the model's fault. The env (a sandbox with a warm judge) is made at the first
    `reset` and reused by later episodes of the same instance; `remote=True` puts it in a Ray actor
    (ray_backend.RemoteEnv) on whichever node has room for a `world`-rank episode.
    """

    def __init__(self, sandbox: str = "local-cpu", max_turns: int = 6, *, remote: bool = False, world: int = 2,
                 **env_options: Any):
        self.sandbox = sandbox
        self.max_turns = max_turns
        self.remote = remote
        self.world = world
        self.env_options = env_options
        self._env: Any = None
        self._finalizer: Any = None
        self._new_episode()

    def _new_episode(self) -> None:
        self.done = False
        self.reward: float | None = None
        self.verdict: str | None = None
        self.correct = False
        self.has_code = False
        self.infra_error: str | None = None

    def _make_env(self, task_id: str) -> Any:
        if self.remote:
            from ..run.ray_backend import RemoteEnv

            env = RemoteEnv(self.sandbox, world=self.world, max_turns=self.max_turns, **self.env_options)
        else:
            from ..episode.gym_env import CommBenchEnv

            env = CommBenchEnv(task=task_id, sandbox=self.sandbox, max_turns=self.max_turns, **self.env_options)
        self._finalizer = weakref.finalize(self, env.close)  # the sandbox goes when this instance does
        return env

    def close(self) -> None:
        """Remove the sandbox now (a later `reset` makes a new one)."""
        if self._finalizer is not None:
            self._finalizer()
        self._env, self._finalizer = None, None

    def reset(self, task: str | None, world_size: int | None = None) -> None:
        """Start an episode on `task`; a sandbox that fails twice leaves `infra_error` set instead of raising."""
        if not task:
            raise CommBenchError("each training row needs a 'task' column (see commbench_env.integrations.task_rows)")
        self._new_episode()
        options = {"task": task, "world_size": world_size}
        for attempt in (1, 2):
            if self._env is None:
                self._env = self._make_env(task)
            try:
                self._env.reset(options={k: v for k, v in options.items() if v is not None})
                return
            except SandboxError as exc:
                self.close()
                if attempt == 2:
                    self.infra_error = f"{type(exc).__name__}: {exc}"

    def act(self, action: Any) -> str:
        """One env step (`{"tool": ..., "source": ...}`, or a reply's text); returns the judge's feedback."""
        if self.infra_error:
            return f"Infrastructure error, not your fault; this episode is not scored. ({self.infra_error})"
        if self.done:
            return "The episode is over (submitted, or the turn budget is used up); this call was not run."
        try:
            out = self._env.play_turn(action)
        except SandboxError as exc:
            self.infra_error = f"{type(exc).__name__}: {exc}"
            self.close()
            return f"Infrastructure error, not your fault; this episode is not scored. ({self.infra_error})"
        self.has_code = self.has_code or out.result is not None  # some code was judged
        if out.verdict:
            self.verdict = out.verdict
        if out.done:
            self.done = True
            self.reward = float(out.episode_reward)  # whatever per-turn shaping the env applies
            self.correct = out.correct
        return out.feedback

    def final_reward(self) -> float | None:
        """The episode's reward: as submitted; else the last code scored (as at truncation); no code: 0; an
        infrastructure failure: None."""
        if self.infra_error:
            return None
        if not self.done and self.has_code:
            self.act({"tool": "submit", "source": ""})
        if self.infra_error:
            return None
        return self.reward if self.reward is not None else 0.0
