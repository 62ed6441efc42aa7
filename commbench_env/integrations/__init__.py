"""Adapters that let RL trainers train on CommBench: prompts built from task cards, rewards from the real judge.

- `trl_adapter`: TRL's GRPOTrainer, single turn (a reward function that judges the code in each completion) and
  multi-turn (an `environment_factory` whose tools are the env's tools).
- `verl_adapter`: verl's multi-turn agent loop (one episode per trajectory, the reward on its last token), the parquet
  rows verl reads, and verl's trainer config with CommBench's overrides.
- `common`: prompts from task cards and `ToolEpisode`, the episode rules both share (infrastructure errors unscored).
- `tiny`: an offline tiny model and tokenizer for smoke runs.

Each adapter imports its framework lazily, so `commbench_env.integrations` imports without any of them.
"""

from .common import SINGLE_TURN_SYSTEM, task_rows

__all__ = ["SINGLE_TURN_SYSTEM", "task_rows"]
