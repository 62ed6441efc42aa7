"""The device host's input staging: same inputs as one at a time, in order, and a pool idle between batches."""

from __future__ import annotations

import threading

import torch

from commbench_env.cards import load_task
from commbench_env.golden import get_op
from commbench_env.judge import staging


def test_inputs_match_serial_generation_in_order(monkeypatch):
    monkeypatch.setattr(staging, "usable_cores", lambda: 4)
    task = load_task("collective/allreduce_twoshot")
    op = get_op(task.card.semantics.op)
    case = op.size_case(task.card.performance, 1 << 20, 2)
    seeds = [[1000 + 7 * it + r for it in range(11)] for r in range(2)]

    def make(it: int) -> list[dict]:
        return [op.make_inputs(case, r, 2, seeds[r][it]) for r in range(2)]

    staged = list(staging.in_batches(make, range(11), threads=4))
    assert len(staged) == 11
    for it, ranks in enumerate(staged):
        for r in range(2):
            assert torch.equal(ranks[r]["x"], make(it)[r]["x"])
    assert not torch.equal(staged[0][0]["x"], staged[1][0]["x"])  # fresh inputs per call


def test_pool_is_idle_while_the_caller_consumes_a_batch(monkeypatch):
    monkeypatch.setattr(staging, "usable_cores", lambda: 3)
    started: list[int] = []
    lock = threading.Lock()
    threads_seen: set[str] = set()

    def make(i: int) -> int:
        with lock:
            started.append(i)
            threads_seen.add(threading.current_thread().name)
        return i * i

    got = []
    for i, value in enumerate(staging.in_batches(make, range(10), threads=8)):
        got.append(value)
        with lock:  # only the batch holding item i (3 at a time) has started, never the next one
            assert len(started) == min(10, (i // 3 + 1) * 3), (i, started)
    assert got == [i * i for i in range(10)]
    assert all(name.startswith("staging") for name in threads_seen)
    assert not [t for t in threading.enumerate() if t.name.startswith("staging")]  # joined once exhausted


def test_one_core_runs_on_the_callers_thread(monkeypatch):
    monkeypatch.setattr(staging, "usable_cores", lambda: 1)
    names = [v for v in staging.in_batches(lambda _: threading.current_thread().name, range(3))]
    assert names == [threading.current_thread().name] * 3
