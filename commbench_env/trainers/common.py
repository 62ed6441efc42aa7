"""Framework-neutral pieces of the trainer adapters: prompts built from task cards."""

from __future__ import annotations

from typing import Any

from ..agents.llm import SYSTEM_PROMPT
from ..cards import select_tasks
from ..runner import pick_world
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
        world = pick_world(task, world_size)
        system = MULTI_TURN_SYSTEM if multi_turn else SINGLE_TURN_SYSTEM
        prompt = [{"role": "system", "content": system},
                  {"role": "user", "content": f"Task statement (world size {world}):\n\n{task.agent_view()}"}]
        rows += [{"prompt": prompt, "task": task.id, "world_size": world} for _ in range(repeats)]
    return rows
