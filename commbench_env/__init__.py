"""CommBench-Env: a Gymnasium environment for multi-GPU communication code written by LLM agents.

Importing the package registers `CommBench-v0`:

    env = gymnasium.make("CommBench-v0", task="collective/allreduce_ring", sandbox="local-cpu", max_turns=4)
"""

import os

__version__ = "0.1.0"


def _register() -> None:
    import gymnasium

    if "CommBench-v0" not in gymnasium.registry:
        gymnasium.register(id="CommBench-v0", entry_point="commbench_env.episode.gym_env:CommBenchEnv",
                           nondeterministic=True)


# The judge inside a sandbox (judge/__main__.py sets this) needs no Gymnasium, whose import is 0.4 s of every call.
if not os.environ.get("COMMBENCH_JUDGE_PROCESS"):
    _register()
