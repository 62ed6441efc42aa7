"""CommBench as an inspect_ai task: `inspect eval` plays CommBench episodes and `inspect view` shows them.

    pip install 'commbench-env[inspect]'
    inspect eval commbench_env/integrations/inspect.py -T tasks=p2p/ring_shift --model openai/gpt-5

- dataset: one sample per task id that `-T tasks=<selector>` picks (`smoke`, `all`, a category, ids, globs, as
  everywhere in CommBench); the sample's input is what `commbench show <id>` prints;
- solver: one `Episode` per sample, closed at the end. Its tools (compile, check, benchmark, profile, submit, and
  sanitize for a CUDA task) are the Episode's tools: each call is one `Episode.step` and returns the judge's feedback.
  A reply without a tool call is one turn too, read by the env's text grammar (a fenced block and a `tool:` line),
  as for our own LLM agents. The episode ends on submit or when its turn budget runs out (the last code is scored);
- scorer: the episode's reward as the score's value, read back from the episode's trace exactly as `commbench report`
  reads it; its metadata holds `correct`, `speedup`, `band`, `reward`, `verdict` and the trace's path; metrics are
  the report's anchor figures (pass rate, PASS+Good, GM speedup, Pass x GM) besides the mean reward.

The judge runs in CommBench's own sandbox (`-T sandbox=local-cpu | docker-cpu | a GPU profile`), not in an inspect
sandbox: the tools run on the eval host and call it, so hidden cases and references stay on the host as with every
other driver. A sandbox failure raises, which inspect records as the sample's error (retry it with
`--retry-on-error`): an infrastructure failure is never scored as the model's fault.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from commbench_env.errors import CommBenchError

try:
    import anyio
    from inspect_ai import Epochs, Task, task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import ChatMessageSystem, ChatMessageUser
    from inspect_ai.scorer import (Metric, SampleScore, Score, ScoreReducer, Target, mean, metric, score_reducer,
                                  scorer)
    from inspect_ai.solver import Generate, Solver, TaskState, solver
    from inspect_ai.tool import Tool, ToolDef
except ImportError as _exc:  # the core works without inspect_ai; this door needs it
    raise CommBenchError(f"the inspect_ai task needs inspect_ai ({_exc}): "
                         "pip install 'commbench-env[inspect]'") from None

from commbench_env import __version__
from commbench_env.agents.llm import TOOL_SPECS
from commbench_env.cards import Task as CardTask
from commbench_env.cards import select_tasks
from commbench_env.episode.actions import TOOLS
from commbench_env.episode.core import Episode
from commbench_env.integrations.common import MULTI_TURN_SYSTEM
from commbench_env.run import report
from commbench_env.sandbox import load_profile
from commbench_env.trace.records import read_trace

STORE_KEY = "commbench"  # the sample store's entry the solver leaves for the scorer
RUN_NAME = "inspect"
_SPECS = {spec["name"]: spec for spec in TOOL_SPECS}


def _selector(tasks: str | list[str]) -> str:
    """`-T tasks=a,b` arrives as text, `-T tasks=[a,b]` (YAML) as a list: both are one CommBench selector."""
    return ",".join(str(t) for t in tasks) if isinstance(tasks, (list, tuple)) else str(tasks)


def task_samples(tasks: str | list[str] = "smoke", *, sandbox: str = "local-cpu", world_size: int | None = None,
                 hints: bool = False) -> list[Sample]:
    """One inspect Sample per selected task: its input is what `commbench show` prints, its id the task id. Tasks
    that cannot run in the sandbox's device mode are left out (as in `task_rows`)."""
    selector = _selector(tasks)
    chosen = select_tasks(selector, device_mode=load_profile(sandbox).device_mode)
    if not chosen:
        raise CommBenchError(f"tasks={selector!r} selects no task that runs in sandbox {sandbox!r} "
                             "(`commbench tasks` lists them)")
    return [_sample(t, world_size, hints) for t in chosen]


def _sample(t: CardTask, world_size: int | None, hints: bool) -> Sample:
    c = t.card
    return Sample(id=t.id, input=t.agent_view(hints=hints),
                  metadata={"task_id": t.id, "task_hash": t.hash, "world_size": t.world_for(world_size),
                            "title": c.title, "category": c.category.value, "difficulty": c.difficulty.value,
                            "language": c.language.value})


def episode_tools(episode: Episode, lock: anyio.Lock) -> list[Tool]:
    """The Episode's tools as inspect tools: each call is one `Episode.step` with the model's complete file as
    `source` (empty: the last code again); sanitize only for a CUDA task, as in `tool_schemas`."""
    cuda = episode.task.card.language.value == "cuda"
    return [_tool(name, episode, lock) for name in TOOLS if name != "sanitize" or cuda]


def _tool(name: str, episode: Episode, lock: anyio.Lock) -> Tool:
    spec = _SPECS[name]

    async def execute(source: str) -> str:
        return await _step(episode, lock, {"tool": name, "source": source})

    return ToolDef(execute, name=name, description=spec["description"],
                   parameters={"source": spec["parameters"]["properties"]["source"]["description"]},
                   parallel=False).as_tool()


async def _step(episode: Episode, lock: anyio.Lock, action: Any) -> str:
    """One turn, off the event loop (a judge run blocks for seconds), one at a time per episode."""
    async with lock:
        if episode.done:
            return "The episode is over (submitted, or the turn budget is used up); this call was not run."
        outcome = await anyio.to_thread.run_sync(episode.step, action)
        return outcome.feedback


@solver
def commbench_agent(sandbox: str = "local-cpu", max_turns: int = 6, hints: bool = False, reference: str = "cached",
                    trace_dir: str | None = None, max_generations: int | None = None) -> Solver:
    """Plays one Episode per sample with the eval's model (after our agents' system prompt, unless the sample has
    one); the Episode judges, rewards and traces every turn.

    `max_generations` (default 2 x max_turns) bounds model calls that play no turn (calls of unknown tools, bad
    arguments), so a confused model cannot loop forever."""
    limit = max_generations or 2 * max_turns

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        meta = state.metadata
        model = str(state.model)
        episode: Episode = await anyio.to_thread.run_sync(lambda: Episode(
            meta["task_id"], sandbox=sandbox, max_turns=max_turns, world_size=meta["world_size"], hints=hints,
            reference=reference, trace_dir=trace_dir,
            agent={"name": f"inspect:{model}", "provider": "inspect_ai", "model": model}))
        lock = anyio.Lock()
        if not any(isinstance(m, ChatMessageSystem) for m in state.messages):  # no templating: the text as it is
            state.messages.insert(0, ChatMessageSystem(content=MULTI_TURN_SYSTEM))
        try:
            await anyio.to_thread.run_sync(episode.start)
            state.store.set(STORE_KEY, {"trace_path": str(episode.trace_path)})
            state.tools = episode_tools(episode, lock)
            for _ in range(limit):
                if episode.done or state.completed:
                    break
                state = await generate(state, tool_calls="single")
                if not state.output.message.tool_calls and not episode.done:
                    # a reply without a tool call is a turn, as for our LLM agents: the env reads its text
                    state.messages.append(ChatMessageUser(content=await _step(episode, lock, state.output.completion)))
            if not episode.done and episode.last_files:  # stopped early (a limit): its last code is scored
                await _step(episode, lock, {"tool": "submit", "source": ""})
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(episode.close)
        return state

    return solve


def _report_episodes(meta: dict[str, Any] | None) -> list[report.Episode]:
    """The report's Episode records behind a score: one per epoch the `commbench_epochs` reducer kept, else the
    score's own (none for a sample left unscored)."""
    fields = {f.name for f in dataclasses.fields(report.Episode)} - {"run"}
    played = (meta or {}).get("epochs") or [meta or {}]
    return [report.Episode(run=RUN_NAME, **{k: m[k] for k in fields}) for m in played if fields <= m.keys()]


def _anchor(pick: Callable[[report.RunMetrics], float]) -> Callable[[list[SampleScore]], float]:
    def compute(scores: list[SampleScore]) -> float:
        episodes = [e for s in scores for e in _report_episodes(s.score.metadata)]
        return float(pick(report.metrics(episodes, RUN_NAME))) if episodes else math.nan

    return compute


@score_reducer(name="commbench_epochs")
def commbench_epochs() -> ScoreReducer:
    """Epochs of a sample as one score: the mean reward, with every epoch's episode kept in `metadata["epochs"]`, so
    the anchor metrics count each episode (inspect's reducers keep the first epoch's metadata only)."""

    def reduce(scores: list[Score]) -> Score:
        rewards = [float(s.value) for s in scores if isinstance(s.value, (int, float))]
        first = scores[0]
        if len(scores) == 1:
            return first
        return Score(value=sum(rewards) / len(rewards) if rewards else 0.0, answer=first.answer,
                     explanation=" | ".join(s.explanation or "" for s in scores),
                     metadata={**(first.metadata or {}), "epochs": [s.metadata or {} for s in scores]})

    return reduce


@metric
def pass_rate() -> Metric:
    """The share of episodes whose final code was fully correct (the report's pass rate)."""
    return _anchor(lambda m: m.pass_rate)


@metric
def pass_good() -> Metric:
    """Correct and at least on par with the reference (the report's PASS+Good)."""
    return _anchor(lambda m: m.pass_good)


@metric
def gm_speedup() -> Metric:
    """Geometric-mean speedup over the reference, over passing episodes (the report's GM speedup)."""
    return _anchor(lambda m: m.gm_speedup)


@metric
def pass_x_gm() -> Metric:
    """Pass rate times GM speedup (the report's Pass x GM)."""
    return _anchor(lambda m: m.pass_x_gm)


@scorer(metrics=[mean(), pass_rate(), pass_good(), gm_speedup(), pass_x_gm()])
def commbench_scorer() -> Callable[..., Any]:
    """The episode's reward, read from its trace the way `commbench report` reads it, so an inspect score and a
    CommBench report of the same episode agree. The trace stays on the host; the score holds its figures only."""

    async def score(state: TaskState, target: Target) -> Score:
        path = (state.store.get(STORE_KEY) or {}).get("trace_path")
        if not path:
            return Score(value=0.0, explanation="no episode was played", metadata={"status": "not played"})
        trace = read_trace(path)
        ep = report.episode_of(trace, RUN_NAME)
        last = trace.steps[-1] if trace.steps else None
        status = trace.end.status if trace.end else "interrupted"
        meta = {k: v for k, v in dataclasses.asdict(ep).items() if k != "run"}
        meta.update(verdict=last.verdict if last else None, status=status, trace_path=str(path),
                    world_size=trace.start.world_size, task_hash=trace.start.task_hash)
        explanation = (f"verdict {meta['verdict']}, reward {ep.reward:.3f}"
                       + (f", speedup {ep.speedup:.3f} ({ep.band})" if ep.speedup else "")
                       + f", {ep.turns} turn(s), {status}")
        code = next((next(iter(st.action.files.values())) for st in reversed(trace.steps) if st.action.files), None)
        return Score(value=ep.reward, answer=code, explanation=explanation, metadata=meta)

    return score


@task
def commbench(tasks: str | list[str] = "smoke", sandbox: str = "local-cpu", max_turns: int = 6,
              world_size: int | None = None, hints: bool = False, reference: str = "cached",
              trace_dir: str | None = None) -> Task:
    """CommBench episodes as an inspect task: `-T tasks=<selector>` picks the tasks (one sample each),
    `-T sandbox=<profile>` where the judge runs, `-T max_turns=N` the turn budget per episode; `--epochs N` plays
    each task N times, and the metrics count every episode."""
    return Task(
        dataset=MemoryDataset(task_samples(tasks, sandbox=sandbox, world_size=world_size, hints=hints),
                              name=f"commbench:{_selector(tasks)}"),
        solver=commbench_agent(sandbox=sandbox, max_turns=max_turns, hints=hints, reference=reference,
                               trace_dir=trace_dir),
        scorer=commbench_scorer(),
        epochs=Epochs(1, commbench_epochs()),  # `--epochs N` sets the count and keeps this reducer
        version=__version__,
        metadata={"commbench_version": __version__, "tasks": _selector(tasks), "sandbox": sandbox,
                  "max_turns": max_turns, "hints": hints, "reference": reference},
    )
