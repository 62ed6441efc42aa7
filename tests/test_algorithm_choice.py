"""On the modelled host cluster the skill a task is about is what wins: its reference beats the single schedules an
agent is likely to write instead. The CPU figure is modelled from the messages, so these margins are exact."""

from __future__ import annotations

import pytest

from commbench_env.cards import load_task
from commbench_env.judge.host.result import Verdict
from commbench_env.score.reward import speedup_vs_reference

from .conftest import SUBMISSIONS

WORLD = 6  # the cards' default: not a power of two, where the textbook schedules lose most


@pytest.fixture(scope="module")
def chooser_reference(evaluate):
    return _benchmark(evaluate, "collective/allreduce_choose_algorithm", None)


def _benchmark(evaluate, task: str, source):
    res = evaluate(task, source, mode="benchmark", world=WORLD)
    assert res.verdict == Verdict.passed, res.feedback()
    assert all(s.modelled is not None for s in res.benchmark)
    return res.benchmark


def _per_size(candidate, reference) -> tuple[float, dict[int, float]]:
    speedup, rows = speedup_vs_reference(candidate, reference)
    return speedup, {r.size_bytes: r.speedup for r in rows}


def test_choosing_by_size_beats_the_latency_optimal_schedule_at_every_size(evaluate, chooser_reference):
    """The block-sum all-reduce of allreduce_recursive_doubling (the best small-message schedule) ties at the
    smallest sizes and loses by almost 2x at 8 MiB, where it moves the whole vector in every round."""
    latency_only = load_task("collective/allreduce_recursive_doubling").reference_source()
    speedup, per_size = _per_size(_benchmark(evaluate, "collective/allreduce_choose_algorithm", latency_only),
                                  chooser_reference)
    smallest, largest = min(per_size), max(per_size)
    assert per_size[smallest] == pytest.approx(1.0, abs=0.02)
    assert per_size[largest] < 0.65
    assert speedup < 0.85


def test_choosing_by_size_beats_the_bandwidth_optimal_schedule_at_every_size(evaluate, chooser_reference):
    """The reduce-scatter + all-gather of allreduce_rabenseifner (the best large-message schedule) is within a few
    percent at 8 MiB and more than 2x slower at 256 bytes, where its 2 ceil(log2 W) messages are the time."""
    bandwidth_only = load_task("collective/allreduce_rabenseifner").reference_source()
    speedup, per_size = _per_size(_benchmark(evaluate, "collective/allreduce_choose_algorithm", bandwidth_only),
                                  chooser_reference)
    smallest, largest = min(per_size), max(per_size)
    assert per_size[smallest] < 0.5
    assert per_size[largest] > 0.95
    assert speedup < 0.75


def test_the_textbook_fold_loses_to_any_size_rabenseifner_where_the_world_is_not_a_power_of_two(evaluate):
    """MPICH's fold (the excess ranks hand their whole vector to a partner) moves the whole vector twice more."""
    task = "collective/allreduce_rabenseifner"
    reference = _benchmark(evaluate, task, None)
    fold = _benchmark(evaluate, task, SUBMISSIONS / "collective/allreduce_rabenseifner/rabenseifner_fold.py")
    speedup, _ = _per_size(fold, reference)
    assert speedup < 0.75


def test_the_ring_loses_to_log_step_rounds_below_the_largest_size(evaluate):
    """The ring moves the optimal bytes too, in 2 (W - 1) rounds instead of 2 ceil(log2 W): at 256 KiB its extra
    messages cost about a third of the time, at 8 MiB a few percent."""
    task = "collective/allreduce_rabenseifner"
    ring = _benchmark(evaluate, task, load_task("collective/allreduce_ring").reference_source())
    speedup, per_size = _per_size(ring, _benchmark(evaluate, task, None))
    assert per_size[min(per_size)] < 0.75
    assert speedup < 0.87


def test_folding_the_excess_ranks_loses_to_block_sums_at_small_sizes(evaluate):
    """The textbook fix for recursive doubling at W = 6 (fold 2 ranks in, double among 4, fold them out) takes
    floor(log2 W) + 2 dependent rounds where the block sums take ceil(log2 W) or fewer."""
    task = "collective/allreduce_recursive_doubling"
    fold = _benchmark(evaluate, task, SUBMISSIONS / "collective/allreduce_recursive_doubling/fold.py")
    speedup, per_size = _per_size(fold, _benchmark(evaluate, task, None))
    assert per_size[min(per_size)] < 0.8
    assert speedup < 0.8
