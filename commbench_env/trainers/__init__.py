"""Adapters that let RL trainers train on CommBench: prompts built from task cards, rewards from the real judge.

- `trl_adapter`: TRL's GRPOTrainer, single turn (a reward function that judges the code in each completion) and
  multi-turn (an `environment_factory` whose tools are the env's tools).
- `tiny`: an offline tiny model and tokenizer for smoke runs.

Each adapter imports its framework lazily, so `commbench_env.trainers` imports without any of them.
"""

from .common import SINGLE_TURN_SYSTEM, task_rows

__all__ = ["SINGLE_TURN_SYSTEM", "task_rows"]
