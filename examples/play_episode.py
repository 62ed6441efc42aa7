"""Play one episode by hand: check a wrong ring, fix it, submit. Shows the feedback an agent gets each turn.

    python examples/play_episode.py
"""

from __future__ import annotations

import gymnasium

import commbench_env  # noqa: F401 - registers CommBench-v0
from commbench_env.cards import load_task

TASK = "collective/allreduce_ring"
OFF_BY_ONE = load_task(TASK).reference_source().replace("(rank - step + 1) % world", "(rank - step) % world", 1)


def main() -> None:
    env = gymnasium.make("CommBench-v0", task=TASK, sandbox="local-cpu", max_turns=4, world_size=4)
    obs, info = env.reset(seed=0)
    print(obs["task"][:600], "...\n")
    for tool, source in (("check", OFF_BY_ONE), ("check", load_task(TASK).reference_source()), ("submit", "")):
        obs, reward, terminated, truncated, info = env.step({"tool": tool, "source": source})
        print(f"--- turn {obs['turn']}: {tool} -> {info['verdict']}, reward {reward:.3f}")
        print(obs["feedback"][:1500])
        if terminated or truncated:
            break
    print("trace:", info["trace_path"])
    env.close()


if __name__ == "__main__":
    main()
