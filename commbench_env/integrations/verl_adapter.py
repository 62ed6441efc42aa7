"""verl's multi-turn agent loop on CommBench.

`CommBenchAgentLoop` is a verl `AgentLoopBase`: verl's agent-loop workers run it once per trajectory. It opens a
CommBench episode on the row's task, lets the policy call the env's tools (compile, check, benchmark, profile,
submit; sanitize too for CUDA tasks) in its chat template's tool-call format (verl's `multi_turn.format` parser,
`hermes` by default), feeds the judge's feedback back as tool messages (masked out of the loss), and returns the
episode's reward as the trajectory's `reward_score`, which verl places on the last response token. A reply without
a tool call is sent to the env as text (a fenced code block and a `tool: <name>` line also work).

On verl's command line (`python -m verl.trainer.main_ppo`), with rows written by `write_verl_dataset` (or
`commbench rows --out commbench_train.parquet`)::

    data.train_files=commbench_train.parquet data.val_files=commbench_train.parquet \\
    actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.multi_turn.enable=True \\
    actor_rollout_ref.rollout.agent.agent_loop_config_path=<VERL_AGENT_LOOP_CONFIG> \\
    actor_rollout_ref.rollout.agent.default_agent_loop=commbench

`VERL_AGENT_LOOP_CONFIG` (verl_agent_loops.yaml beside this file) registers the loop and holds its options
(sandbox profile, turn budget, how many trajectories of a worker hold a sandbox at once). verl has no way to leave
a sample out of a batch, so an episode the sandbox failed twice scores 0 with `commbench_infra_error` set in its
extra fields and a warning logged; watch for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from uuid import uuid4

try:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.utils.profiler import simple_timer
    from verl.workers.rollout.replica import TokenOutput
except ImportError as exc:  # the loop subclasses verl's, so verl must be importable
    raise ImportError(f"the verl adapter needs verl 0.9 ({exc}): pip install 'commbench-env[verl]'") from exc

from .common import VERL_AGENT_NAME as AGENT_NAME
from .common import ToolEpisode, tool_schemas, verl_rows, write_rows

VERL_AGENT_LOOP_CONFIG = Path(__file__).with_name("verl_agent_loops.yaml")
log = logging.getLogger(__name__)
__all__ = ["AGENT_NAME", "VERL_AGENT_LOOP_CONFIG", "CommBenchAgentLoop", "verl_config", "verl_rows",
           "write_verl_dataset"]


def write_verl_dataset(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write `verl_rows` rows as the parquet file verl's `data.train_files` reads."""
    return write_rows(rows, path, fmt="parquet")


def verl_config(model: str | Path, data_file: str | Path, *, loop_config: str | Path = VERL_AGENT_LOOP_CONFIG,
                overrides: Sequence[str] = ()) -> Any:
    """verl's own trainer config (its ppo_trainer.yaml) with what a CommBench run sets: GRPO, the rows' file, raw chat
    prompts, async multi-turn rollout with hermes tool calls, and this loop as the default agent loop; `overrides`
    (Hydra syntax, as on verl's command line) come last."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            "algorithm.adv_estimator=grpo", f"data.train_files={data_file}", f"data.val_files={data_file}",
            "data.max_prompt_length=4096", "data.max_response_length=4096", "data.return_raw_chat=True",
            f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.calculate_log_probs=True",
            "actor_rollout_ref.rollout.multi_turn.enable=True", "actor_rollout_ref.rollout.multi_turn.format=hermes",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loop_config}",
            f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}",
            "actor_rollout_ref.rollout.agent.num_workers=1", *overrides])


class _IdleEpisodes:
    """Warm episodes (each a sandbox with its judge) kept between trajectories: verl makes a new agent loop for every
    trajectory, and starting a sandbox costs a fresh interpreter importing torch. `episode()` also bounds how many
    trajectories of one event loop hold a sandbox at once (`max_sandboxes`): each is a judge and its rank processes,
    and a worker runs every trajectory of its share of the batch at once. The bound is an asyncio semaphore, so
    waiting trajectories hold no executor thread that a running one needs for its judge calls."""

    def __init__(self) -> None:
        self._idle: dict[str, list[ToolEpisode]] = {}
        self._lock = threading.Lock()
        self._gates: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> key -> semaphore

    def idle(self, key: str) -> int:
        with self._lock:
            return len(self._idle.get(key, []))

    @contextlib.asynccontextmanager
    async def episode(self, key: str, limit: int | None, make: Any) -> AsyncIterator[ToolEpisode]:
        gates = self._gates.setdefault(asyncio.get_running_loop(), {})
        gate = gates.setdefault(key, asyncio.Semaphore(limit)) if limit else contextlib.AsyncExitStack()
        async with gate:
            with self._lock:
                idle = self._idle.get(key)
                episode = idle.pop() if idle else None
            episode = episode or make()
            try:
                yield episode
            finally:
                if episode.infra_error:
                    episode.close()  # a sandbox that failed is not reused
                else:
                    with self._lock:
                        self._idle.setdefault(key, []).append(episode)


_EPISODES = _IdleEpisodes()


def _action(content: str, calls: list[Any]) -> tuple[Any, str | None]:
    """The env action for one reply: its first tool call, else its text; and a note for unreadable arguments."""
    if not calls:
        return content, None
    call = calls[0]
    try:
        args = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as exc:
        return None, f"The arguments of your {call.name} call are not valid JSON ({exc}); nothing was run."
    source = args.get("source", "") if isinstance(args, dict) else ""
    note = "Only your first tool call was run." if len(calls) > 1 else None
    return {"tool": call.name, "source": source if isinstance(source, str) else ""}, note


@register(AGENT_NAME)
class CommBenchAgentLoop(AgentLoopBase):
    """One CommBench episode per trajectory; options come from the agent-loop config (or keyword arguments):
    `sandbox` (profile that judges, default local-cpu), `max_turns` (the env's turn budget, default 4), `remote`
    (judge in a Ray actor), `max_sandboxes` (trajectories of one agent-loop worker that play at once, each holding
    a sandbox; default 8, None for no bound) and `env_options` (CommBenchEnv options, e.g. `reward`)."""

    def __init__(self, *args: Any, sandbox: str = "local-cpu", max_turns: int = 4, remote: bool = False,
                 max_sandboxes: int | None = 8, env_options: dict[str, Any] | None = None, **kwargs: Any):
        kwargs.pop("tools", None)  # verl's own tool list: this loop's tools are the env's
        super().__init__(*args, **kwargs)
        self.sandbox = sandbox
        self.max_turns = max_turns
        self.remote = remote
        self.max_sandboxes = max_sandboxes
        self.env_options = dict(env_options or {})
        self.response_length = self.rollout_config.response_length
        self.tool_parser = ToolParser.get_tool_parser(self.rollout_config.multi_turn.format, self.tokenizer)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra = dict(kwargs.get("extra_info") or {})
        world = extra.get("world_size")
        world = int(world) if world is not None else None
        key = json.dumps([self.sandbox, self.max_turns, self.remote, world, self.env_options], sort_keys=True,
                         default=str)
        make = lambda: ToolEpisode(self.sandbox, self.max_turns, remote=self.remote,  # noqa: E731
                                   world=world or 2, **self.env_options)
        async with _EPISODES.episode(key, self.max_sandboxes, make) as episode:
            await asyncio.get_running_loop().run_in_executor(None, episode.reset, extra.get("task"), world)
            metrics: dict[str, float] = {}  # verl's AgentLoopMetrics: seconds generating and in tool calls
            runtime_ids, mask, logprobs, turns = await self._play(episode, list(kwargs["raw_prompt"]),
                                                                  tool_schemas(extra.get("task")), sampling_params,
                                                                  metrics)
            reward = await asyncio.get_running_loop().run_in_executor(None, episode.final_reward)
            # read before the episode goes back: the next trajectory to borrow it resets these
            extra_fields: dict[str, Any] = {"turn_scores": [], "tool_rewards": [],
                                            "commbench_verdict": episode.verdict or "", "commbench_correct":
                                            episode.correct, "commbench_infra_error": episode.infra_error or ""}
        if reward is None:
            log.warning("CommBench episode on %s not scored (infrastructure error: %s); verl cannot drop a sample, "
                        "so it scores 0", extra.get("task"), extra_fields["commbench_infra_error"])
            reward = 0.0
        n_prompt = len(runtime_ids) - len(mask)
        return AgentLoopOutput(
            prompt_ids=runtime_ids[:n_prompt], response_ids=runtime_ids[n_prompt:][: self.response_length],
            response_mask=mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] if logprobs else None,
            reward_score=float(reward), num_turns=turns, metrics=metrics, extra_fields=extra_fields)

    async def _play(self, episode: ToolEpisode, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                    sampling_params: dict[str, Any],
                    metrics: dict[str, float]) -> tuple[list[int], list[int], list[float], int]:
        """Generate, act, append the feedback, until the episode ends or the response budget is spent; returns the
        token ids (prompt then response), the response mask and log-probs, and the number of turns."""
        loop = asyncio.get_running_loop()
        prompt_ids = await self.ct_build_initial_tokens(messages, tools=tools)
        runtime_ids, mask, logprobs = list(prompt_ids), [], []
        request_id, turns = uuid4().hex, 1
        while True:
            with simple_timer("generate_sequences", metrics):
                out: TokenOutput = await self.server_manager.generate(
                    request_id=request_id, prompt_ids=runtime_ids, sampling_params=sampling_params)
            merged, mask, logprobs = await self.ct_merge_assistant_token(
                runtime_ids, out.token_ids, mask, logprobs if (logprobs or out.log_probs) else None,
                assistant_logprobs=out.log_probs or None)
            runtime_ids, turns = merged.token_ids, turns + 1
            if len(mask) >= self.response_length:
                break
            content, calls = await self.tool_parser.extract_tool_calls(out.token_ids, tools)
            action, note = _action(content, calls)
            feedback = note or ""
            if action is not None:
                with simple_timer("tool_calls", metrics):
                    feedback = await loop.run_in_executor(None, episode.act, action)
                feedback = f"{note}\n\n{feedback}" if note else feedback
            if episode.done or episode.infra_error:
                break
            previous = [*messages, self._assistant_message(content, calls)]
            messages = [*previous, {"role": "tool" if calls else "user", "content": feedback}]
            merged, new_mask, new_logprobs = await self.ct_merge_context_msg(
                previous, messages, runtime_ids, mask, logprobs or None, tools=tools)
            if len(new_mask) >= self.response_length:
                break
            runtime_ids, mask, logprobs, turns = merged.token_ids, new_mask, new_logprobs or [], turns + 1
        return runtime_ids, mask, logprobs, turns

    @staticmethod
    def _assistant_message(content: str, calls: list[Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content or ""}
        if calls:
            message["tool_calls"] = [{"type": "function", "id": f"call_{i}", "function": {
                "name": c.name, "arguments": _json_or_text(c.arguments)}} for i, c in enumerate(calls)]
        return message


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return arguments
