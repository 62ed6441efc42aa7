"""Debug an episode from its trace: print it turn by turn, then replay its actions and compare the verdicts.

    python examples/debug_trace.py PATH/TO/TRACE.jsonl
    (without an argument, it first records one episode of the reference agent)
"""

from __future__ import annotations

import sys
import tempfile

from commbench_env.agents import load_agent
from commbench_env.agents.base import AgentCard
from commbench_env.episode.gym_env import CommBenchEnv
from commbench_env.run.runner import play_episode
from commbench_env.trace.records import format_trace, read_trace


def main() -> None:
    if len(sys.argv) > 1:
        path = sys.argv[1]
    else:
        env = CommBenchEnv(task="p2p/ring_shift", world_size=2, max_turns=4, trace_dir=tempfile.mkdtemp())
        path = play_episode(env, load_agent("reference")).trace_path
        env.close()
    trace = read_trace(path)
    print(format_trace(trace))
    world = trace.start.world_size
    env = CommBenchEnv(task=trace.task_id, world_size=world, max_turns=len(trace.steps), trace_dir=tempfile.mkdtemp())
    replayed = play_episode(env, load_agent(AgentCard(name="replay", kind="replay", params={"trace": str(path)})))
    env.close()
    again = read_trace(replayed.trace_path)
    print("\nreplay:")
    for old, new in zip(trace.steps, again.steps):
        a, b = old.verdict, new.verdict
        print(f"  turn {old.turn}: recorded {a}, replayed {b} -> {'same' if a == b else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
