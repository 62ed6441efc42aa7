"""Sampled verification of timed calls: ops that compute their outputs at the sampled positions only must give
what indexing their full expected outputs gives, at the positions the ranks drew; a wrong sample is caught."""

from __future__ import annotations

import secrets

import pytest
import torch

from commbench_env.cards import load_task
from commbench_env.golden.base import GoldenOp
from commbench_env.judge.coordinator import evaluation
from commbench_env.judge.host.request import JudgeRequest

# task -> whether the sampled values are bit-identical (same sums in the same order) or only equal to rounding
# (a matmul's dot products in another order: the float64 sums may differ in their last bit before narrowing)
TASKS = {"collective/allreduce_twoshot": True, "fusion/allreduce_residual_rmsnorm": True,
         "collective/reduce_scatter_mesh": True, "fusion/vocab_parallel_cross_entropy": True,
         "fusion/allgather_matmul": False, "fusion/matmul_reduce_scatter": False, "ep/moe_dispatch_combine": True}


def _evaluation(task_id: str, world: int) -> evaluation.Evaluation:
    task = load_task(task_id)
    req = JudgeRequest(task=task.judge_spec(), mode="benchmark", world_size=world,
                       secret=secrets.token_bytes(32).hex(), workdir="/nonexistent")
    return evaluation.Evaluation(req)


def _cases(task_id: str, world: int):
    ev = _evaluation(task_id, world)
    perf = ev.card.performance
    return [*ev.card.cases, ev.op.size_case(perf, perf.sizes[0], world)]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_sampled_values_match_the_full_expectation(task_id, world, monkeypatch):
    ev = _evaluation(task_id, world)
    assert type(ev.op).expected_samples is not GoldenOp.expected_samples, "this op should sample cheaply"
    for n, case in enumerate(_cases(task_id, world)):
        inputs = [ev.op.make_inputs(case, r, world, 100 * n + r) for r in range(world)]
        fast = ev.sampled_expectation(case, 4096, n, inputs)
        with monkeypatch.context() as m:
            m.setattr(type(ev.op), "expected_samples", GoldenOp.expected_samples)
            slow = ev.sampled_expectation(case, 4096, n, inputs)
        assert len(fast) == len(slow) == world
        for r in range(world):
            assert fast[r].keys() == slow[r].keys()
            for name, (numel, idx, values) in fast[r].items():
                s_numel, s_idx, s_values = slow[r][name]
                assert numel == s_numel and torch.equal(idx, s_idx), case.name
                assert values.dtype == s_values.dtype and values.shape == s_values.shape, case.name
                exact = {"rtol": 0, "atol": 0} if TASKS[task_id] else {}  # else: torch's defaults for the dtype
                torch.testing.assert_close(values, s_values, **exact, msg=f"{task_id} {case.name} rank {r}")


def test_a_wrong_sampled_value_is_caught_with_its_rank_and_position():
    world, it, size = 2, 3, 65536
    ev = _evaluation("fusion/allreduce_residual_rmsnorm", world)
    case = ev.op.size_case(ev.card.performance, size, world)
    seeds = [[7 + 11 * i + r for i in range(it + 1)] for r in range(world)]
    inputs = [ev.op.make_inputs(case, r, world, seeds[r][it]) for r in range(world)]
    full = ev.op.expected(case, world, inputs)
    right = ev.sampled_expectation(case, size, it, inputs)  # the positions the ranks draw

    def reported(bad_rank: int | None, bad_input: bool = False) -> dict[int, tuple[dict, dict]]:
        """What ranks hand back: samples of outputs, and samples of read-only inputs (drawn as ranks draw them)."""
        from commbench_env.judge.protocol import sample_together

        per_rank = {}
        for r in range(world):
            numel, idx, _ = right[r]["y"]
            got = full[r]["y"].reshape(-1)[idx].clone()
            if r == bad_rank:
                got[5] += 1.0
            shown = {k: v.clone() for k, v in ev.op.candidate_inputs(inputs[r]).items()}
            if bad_input and r == 1:
                next(iter(shown.values())).reshape(-1)[:] += 1
            per_rank[r] = ({"y": got, "y#numel": torch.tensor([numel])},
                           sample_together(shown, ev.seed("sample-in", size, it)))
        return per_rank

    assert ev.verify_iteration(case, size, seeds, it, reported(None), full=False) is None
    m = ev.verify_iteration(case, size, seeds, it, reported(1), full=False)
    assert m is not None and m.rank == 1 and m.output == "y"
    assert m.index == [int(right[1]["y"][1][5])]
    assert "timed iteration 3" in m.detail
    if ev.card.rules.inputs_read_only:  # an input changed by a timed call is caught from its samples
        m = ev.verify_iteration(case, size, seeds, it, reported(None, bad_input=True), full=False)
        assert m is not None and m.rank == 1 and m.reason == "input_mutated"


def test_ranks_sample_where_the_coordinator_looks_and_report_empty_outputs():
    """protocol.sample_outputs (ranks, device host) and sample_positions (coordinator) draw the same positions;
    an empty output draws nothing and still reports its size, so the coordinator can check it."""
    import torch

    from commbench_env.judge.protocol import SAMPLES_PER_OUTPUT, sample_outputs, sample_positions

    outs = {"y": torch.arange(1000.0), "empty": torch.zeros(0), "count": torch.arange(3)}
    got = sample_outputs(outs, 1234, prefix="1/")
    gen = torch.Generator().manual_seed(1234)
    for name in sorted(outs):  # the coordinator's order
        idx = sample_positions(outs[name].numel(), gen)
        assert torch.equal(got[f"1/{name}"], outs[name][idx]), name
        assert int(got[f"1/{name}#numel"][0]) == outs[name].numel()
    assert got["1/y"].numel() == SAMPLES_PER_OUTPUT and got["1/empty"].numel() == 0
