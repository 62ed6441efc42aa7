"""The shape of an RL loop: many short episodes, a policy that proposes code, rewards collected per episode.

The "policy" here samples from a few hand-written candidates (a real trainer would sample from an LLM); the env
is reused across episodes, so the warm judge keeps steps fast.

    python examples/rl_rollouts.py --episodes 6
"""

from __future__ import annotations

import argparse
import random
import statistics

from commbench_env.cards import load_task
from commbench_env.episode.gym_env import CommBenchEnv

TASK = "p2p/ring_shift"
CANDIDATES = {
    "wrong-direction": "import torch\nimport torch.distributed as dist\n\ndef ring_shift(x):\n"
                       "    r, w = dist.get_rank(), dist.get_world_size()\n    out = torch.empty_like(x)\n"
                       "    reqs = [dist.isend(x, (r - 1) % w), dist.irecv(out, (r + 1) % w)]\n"
                       "    for q in reqs:\n        q.wait()\n    return out\n",
    "no-communication": "import torch\n\ndef ring_shift(x):\n    return x.clone()\n",
    "reference": load_task(TASK).reference_source(),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    env = CommBenchEnv(task=TASK, world_size=4, max_turns=2)
    rewards: dict[str, list[float]] = {k: [] for k in CANDIDATES}
    for ep in range(a.episodes):
        env.reset(seed=a.seed + ep)
        name = rng.choice(list(CANDIDATES))
        _, reward, terminated, truncated, info = env.step({"tool": "submit", "source": CANDIDATES[name]})
        rewards[name].append(reward)
        print(f"episode {ep}: {name:<17} verdict {info['verdict']:<13} reward {reward:.3f}  ({info['step_s']:.2f} s)")
    env.close()
    for name, rs in rewards.items():
        if rs:
            print(f"{name:<17} mean reward {statistics.mean(rs):.3f} over {len(rs)} episode(s)")


if __name__ == "__main__":
    main()
