"""Episode hooks and reward schedules: the trace is one hook among others, a caller's hook sees the same typed
records the trace keeps, and a custom schedule decides every step's reward."""

from __future__ import annotations

from commbench_env.cards import load_task
from commbench_env.episode import CommBenchEnv, Episode
from commbench_env.episode.hooks import EpisodeHook
from commbench_env.trace.records import read_trace

TASK = "p2p/ring_shift"


class Recorder(EpisodeHook):
    def __init__(self):
        self.events = []

    def on_start(self, episode, record):
        self.events.append(("start", record.task_id))

    def on_step(self, episode, outcome, record):
        self.events.append(("step", record.turn, outcome.verdict, record.verdict))

    def on_end(self, episode, record):
        self.events.append(("end", record.status, record.turns))


def test_a_hook_sees_every_record_the_trace_keeps(tmp_path):
    hook = Recorder()
    env = CommBenchEnv(task=TASK, max_turns=3, world_size=2, trace_dir=str(tmp_path), hooks=[hook])
    src = load_task(TASK).reference_source()
    try:
        env.reset()
        env.step({"tool": "compile", "source": src})
        env.step({"tool": "check", "source": src})
        env.reset()  # the first episode ends unfinished: interrupted, once
    finally:
        env.close()
    assert hook.events[:4] == [("start", TASK), ("step", 1, "compiled", "compiled"), ("step", 2, "pass", "pass"),
                               ("end", "interrupted", 2)]
    assert hook.events[4:] == [("start", TASK), ("end", "interrupted", 0)]  # close() ends the second one
    traces = sorted(tmp_path.glob("*.jsonl"))
    assert sorted(len(read_trace(t).steps) for t in traces) == [0, 2]  # the trace hook saw the same


class Halves:
    """A schedule of the caller's: every judged turn earns half its score, the last the final reward."""

    def __init__(self, cfg):
        self.scores, self.rewards = [], []

    def step(self, score, final=None):
        s = final if final is not None else (score or 0.0)
        self.scores.append(s)
        self.rewards.append(s if final is not None else s / 2)
        return self.rewards[-1]

    def turn_rewards(self):
        return list(self.rewards)


def test_a_custom_reward_schedule_decides_each_steps_reward(tmp_path):
    ep = Episode(task=TASK, max_turns=3, world_size=2, trace_dir=str(tmp_path), reward_schedule=Halves,
                 reference="none")
    src = load_task(TASK).reference_source()
    try:
        ep.start()
        first = ep.step({"tool": "check", "source": src})
        last = ep.step({"tool": "submit", "source": src})
    finally:
        ep.close()
    assert first.turn_score > 0 and first.reward == first.turn_score / 2
    assert last.done and last.reward == last.final_reward and last.turn_rewards == [first.reward, last.reward]
    assert read_trace(ep.trace_path).end.turn_rewards == [first.reward, last.reward]
