"""Golden ops of the second-wave p2p CUDA tasks (ring_recv_add, strided_pack_shift), checked on the CPU against
plain-Python computations, and the cards' promises about their buffers (issue #23)."""

from __future__ import annotations

import math

import pytest
import torch

from commbench_env.cards import CaseSpec, PerformanceSpec, load_task
from commbench_env.golden import get_op


def _inputs(op, case, world):
    return [op.make_inputs(case, r, world, 4242 + 31 * r) for r in range(world)]


# ---- ring_recv_add ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_recv_add_is_left_plus_own(world, dtype):
    op = get_op("ring_recv_add")
    case = CaseSpec(name="c", shape=[5, 3], dtype=dtype)
    inputs = _inputs(op, case, world)
    exp = op.expected(case, world, inputs)
    for r in range(world):
        left = inputs[(r - 1) % world]["x"].reshape(-1).tolist()
        own = inputs[r]["x"].reshape(-1).tolist()
        got = exp[r]["y"].reshape(-1).tolist()
        assert exp[r]["y"].dtype == torch.float64 and list(exp[r]["y"].shape) == [5, 3]
        assert got == [a + b for a, b in zip(left, own)]


def test_recv_add_by_hand():
    op = get_op("ring_recv_add")
    case = CaseSpec(name="c", shape=[2], dtype="float32")
    inputs = [{"x": torch.tensor([1.0, 2.0])}, {"x": torch.tensor([10.0, 20.0])}, {"x": torch.tensor([100.0, 200.0])}]
    exp = op.expected(case, 3, inputs)
    assert [e["y"].tolist() for e in exp] == [[101.0, 202.0], [11.0, 22.0], [110.0, 220.0]]


def test_recv_add_catches_a_payload_read_too_early():
    """A receiver that reads zeroed scratch (the payload not yet there) returns its own x: far outside tolerance."""
    op = get_op("ring_recv_add")
    case = CaseSpec(name="c", shape=[4096], dtype="bfloat16")
    inputs = _inputs(op, case, 2)
    early = [{"y": inputs[r]["x"].clone()} for r in range(2)]
    m = op.verify(case, 2, inputs, early, (2e-2, 2e-2))
    assert m is not None and m["wrong_count"] > 3000
    right = [{"y": e["y"].to(torch.bfloat16)} for e in op.expected(case, 2, inputs)]  # rounded once: passes
    assert op.verify(case, 2, inputs, right, (2e-2, 2e-2)) is None


@pytest.mark.parametrize("dtype", ["int32", "uint8"])
def test_recv_add_refuses_integer_cases(dtype):
    with pytest.raises(ValueError, match="dtype"):
        get_op("ring_recv_add").validate_case(CaseSpec(name="c", shape=[8], dtype=dtype))


# ---- strided_pack_shift ----------------------------------------------------------------------------------------
def _region_by_hand(x: torch.Tensor, row0, col0, rows, cols) -> list:
    flat, w = x.reshape(-1).tolist(), x.shape[1]
    return [flat[(row0 + i) * w + col0 + j] for i in range(rows) for j in range(cols)]


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("shape,params,dtype", [
    ([6, 9], dict(row0=1, col0=2, rows=4, cols=5), "float32"),
    ([5, 7], dict(row0=4, col0=6, rows=1, cols=1), "bfloat16"),
    ([10, 3], dict(row0=0, col0=0, rows=10, cols=3), "uint8"),
    ([8, 33], dict(row0=3, col0=32, rows=5, cols=1), "float64"),
])
def test_strided_pack_is_the_left_neighbours_region(world, shape, params, dtype):
    op = get_op("strided_pack_shift")
    case = CaseSpec(name="c", shape=shape, dtype=dtype, params={**params, "stride": shape[1]})
    op.validate_case(case)
    inputs = _inputs(op, case, world)
    exp = op.expected(case, world, inputs)
    for r in range(world):
        y = exp[r]["y"]
        assert y.is_contiguous() and list(y.shape) == [params["rows"], params["cols"]]
        assert y.dtype == inputs[r]["x"].dtype
        assert y.reshape(-1).tolist() == _region_by_hand(inputs[(r - 1) % world]["x"], **params)
    assert op.metric_bytes(case, world) == params["rows"] * params["cols"] * inputs[0]["x"].element_size()


@pytest.mark.parametrize("params,match", [
    (dict(row0=0, col0=0, rows=1, cols=1, stride=8), "stride"),
    (dict(row0=3, col0=0, rows=3, cols=1, stride=7), "rows"),
    (dict(row0=0, col0=5, rows=1, cols=3, stride=7), "columns"),
    (dict(row0=0, col0=0, rows=0, cols=3, stride=7), "rows"),
    (dict(row0=0, col0=0, rows=1, cols=3, stride=7, pad=1), "unknown"),
])
def test_strided_pack_refuses_regions_outside_x(params, match):
    with pytest.raises(ValueError, match=match):
        get_op("strided_pack_shift").validate_case(CaseSpec(name="c", shape=[5, 7], dtype="float32", params=params))


@pytest.mark.parametrize("size", [1 << 20, 16 << 20, 64 << 20])
def test_strided_pack_benchmark_case_has_the_size(size):
    op = get_op("strided_pack_shift")
    perf = PerformanceSpec(metric="busbw", sizes=[size], dtype="bfloat16",
                           params={"cols": 3001, "stride": 4096, "row0": 3, "col0": 5})
    case = op.size_case(perf, size, 2)
    op.validate_case(case)
    assert case.shape[1] == 4096 and case.params["cols"] == 3001 and case.params["row0"] == 3
    assert size - 3001 * 2 < op.metric_bytes(case, 2) <= size


# ---- the cards -------------------------------------------------------------------------------------------------
def _scratch(card, nbytes: int) -> int:
    """The scratch the device host gives a rank (judge/candidate/device_host.py: scratch_for)."""
    c = card.cuda
    return max(c.scratch_bytes, int(c.scratch_per_input * nbytes), 256)


def _bytes(case) -> int:
    return math.prod(case.shape) * torch.empty((), dtype=getattr(torch, case.dtype)).element_size()


def test_ll128_scratch_fits_128_byte_lines_but_not_ll_lines():
    card = load_task("p2p/ll128_ring_shift").card
    sizes = [_bytes(c) for c in card.cases] + list(card.performance.gpu_sizes) + [1, 119, 120, 121, 2193, 3840]
    for n in sizes:
        assert 128 * -(-n // 120) <= _scratch(card, n), n
    big = max(_bytes(c) for c in card.cases)
    assert _scratch(card, big) < 2 * big  # LL's 16-byte lines of 8 payload bytes do not fit


def test_credit_ring_inputs_exceed_every_ranks_scratch_together():
    card = load_task("p2p/credit_ring_buffer").card
    assert card.cuda.scratch_per_input == 0 and card.cuda.scratch_bytes == 4 << 20
    visible = [c for c in card.cases if c.visible]
    assert max(_bytes(c) for c in visible) > card.cuda.scratch_bytes  # the visible cases already need the ring
    biggest = max(_bytes(c) for c in card.cases)
    assert biggest > max(card.world.sizes) * card.cuda.scratch_bytes
    assert max(card.performance.gpu_sizes) >= 16 * card.cuda.scratch_bytes


@pytest.mark.parametrize("task", ["p2p/ll128_ring_shift", "p2p/credit_ring_buffer", "p2p/put_with_signal"])
def test_inputs_and_outputs_are_private(task):
    assert load_task(task).card.cuda.peer_buffers == ["scratch", "flags"]


def test_strided_pack_input_is_private_and_params_reach_the_kernel_in_order():
    card = load_task("p2p/strided_pack_put").card
    assert "in" not in card.cuda.peer_buffers and "out" in card.cuda.peer_buffers
    assert card.cuda.params == ["row0", "col0", "rows", "cols", "stride"]  # the prompt's params[0..4]


def test_recv_add_samples_match_the_full_expectation():
    op = get_op("ring_recv_add")
    case = CaseSpec(name="c", shape=[7, 11], dtype="bfloat16")
    inputs = _inputs(op, case, 3)
    full = op.expected(case, 3, inputs)
    picks = {r: torch.tensor([0, 5, 76, 33]) + r for r in range(3)}
    got = op.expected_samples(case, 3, inputs, lambda r, name, numel: picks[r] % numel)
    for r in range(3):
        assert torch.equal(got[r]["y"], full[r]["y"].reshape(-1)[picks[r] % 77])


@pytest.mark.parametrize("world", [2, 3])
def test_put_with_signal_samples_like_the_coordinator_does(world, monkeypatch):
    """As tests/test_sampled_expectation.py does for the ops it lists: the coordinator's sampled expectation for
    p2p/put_with_signal equals indexing the full one, at the positions the ranks drew."""
    import secrets

    from commbench_env.golden.base import GoldenOp
    from commbench_env.judge.coordinator import evaluation
    from commbench_env.judge.host.request import JudgeRequest

    task = load_task("p2p/put_with_signal")
    req = JudgeRequest(task=task.judge_spec(), mode="benchmark", world_size=world,
                       secret=secrets.token_bytes(32).hex(), workdir="/nonexistent")
    ev = evaluation.Evaluation(req)
    perf = ev.card.performance
    for n, case in enumerate([*ev.card.cases[:6], ev.op.size_case(perf, perf.sizes[0], world)]):
        inputs = [ev.op.make_inputs(case, r, world, 100 * n + r) for r in range(world)]
        fast = ev.sampled_expectation(case, 4096, n, inputs)
        with monkeypatch.context() as m:
            m.setattr(type(ev.op), "expected_samples", GoldenOp.expected_samples)
            slow = ev.sampled_expectation(case, 4096, n, inputs)
        for r in range(world):
            (numel, idx, values), (s_numel, s_idx, s_values) = fast[r]["y"], slow[r]["y"]
            assert numel == s_numel and torch.equal(idx, s_idx), case.name
            torch.testing.assert_close(values, s_values, rtol=0, atol=0, msg=f"{case.name} rank {r}")
