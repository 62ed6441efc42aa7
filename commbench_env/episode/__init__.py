"""The episode stage: one task played turn by turn.

`core.Episode` is the one turn loop every driver uses (the Gymnasium env, `commbench run`/`eval`, the rollout pool,
Ray, the trainers); `gym_env.CommBenchEnv` adapts it to Gymnasium; `actions` is the one grammar of agent actions.
"""

from .core import Episode, EpisodeConfig, StepOutcome
from .gym_env import CommBenchEnv

__all__ = ["CommBenchEnv", "Episode", "EpisodeConfig", "StepOutcome"]
