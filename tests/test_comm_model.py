"""The modelled time of a call (judge/coordinator/comm_model.py) and the fabric that logs it (fabric.py).

The fabric is driven here exactly as ranks drive it, frame by frame, so these tests pin down what an algorithm's
traffic is worth on the link model; test_modelled_time.py runs real ranks through the judge."""

from __future__ import annotations

import pytest
import torch

from commbench_env.judge.coordinator.comm_model import simulate
from commbench_env.judge.coordinator.fabric import Fabric, FabricError
from commbench_env.judge.link_model import LinkModel

MODEL = LinkModel(port_gbps=100.0, alpha_us=1.0, overhead_us=0.0)  # 100 bytes per ns: 1 MB takes 10 us


def _send(f: Fabric, r: int, h: int, to: int, payload: bytes, tag: int = 0):
    return f.handle(r, {"type": "net", "op": "send", "h": h, "to": to, "tag": tag, "g": "0"}, payload)


def _recv(f: Fabric, r: int, h: int, frm: int, nbytes: int, tag: int = 0):
    return f.handle(r, {"type": "net", "op": "recv", "h": h, "from": frm, "tag": tag, "g": "0", "nbytes": nbytes}, b"")


def _wait(f: Fabric, r: int, h: int):
    return f.handle(r, {"type": "net", "op": "wait", "h": h}, b"")


def _coll(f: Fabric, r: int, h: int, kind: str, payload: bytes, **kw):
    return f.handle(r, {"type": "net", "op": "coll", "h": h, "g": "0", "kind": kind, "dtype": "float32", **kw},
                    payload)


def ring_allreduce(f: Fabric, world: int, nbytes: int) -> None:
    """The frames of a ring all-reduce, issued rank by rank and step by step (each step: send right, receive left,
    wait for both), in the order a scheduler might interleave them."""
    chunk = nbytes // world
    h = 0
    for step in range(2 * (world - 1)):
        for r in range(world):
            _send(f, r, h * 10 + 1, (r + 1) % world, b"x" * chunk)
        for r in range(world):
            _recv(f, r, h * 10 + 2, (r - 1) % world, chunk)
        for r in range(world):
            _wait(f, r, h * 10 + 1)
            _wait(f, r, h * 10 + 2)
        h += 1


def chain_allreduce(f: Fabric, world: int, nbytes: int) -> None:
    """Reduce along the chain 0 -> world-1, then send the sum back down: correct, and serial."""
    for r in range(world - 1):
        _send(f, r, 100 + r, r + 1, b"x" * nbytes)
        _recv(f, r + 1, 200 + r, r, nbytes)
        _wait(f, r + 1, 200 + r)
    for r in range(world - 1, 0, -1):
        _send(f, r, 300 + r, r - 1, b"x" * nbytes)
        _recv(f, r - 1, 400 + r, r, nbytes)
        _wait(f, r - 1, 400 + r)


def modelled(drive, world: int, nbytes: int) -> float:
    f = Fabric(world, MODEL)
    f.open_window()
    drive(f, world, nbytes)
    return f.close_window().time_us


def test_ring_allreduce_costs_the_alpha_beta_formula():
    world, n = 4, 4_000_000
    expected = 2 * (world - 1) * (MODEL.alpha_us + n / world / 100e3)
    assert modelled(ring_allreduce, world, n) == pytest.approx(expected)


def test_chain_scores_clearly_below_the_ring_and_root_gather_is_bound_by_the_roots_port():
    world, n = 8, 8_000_000
    ring = modelled(ring_allreduce, world, n)
    chain = modelled(chain_allreduce, world, n)
    assert chain > 3 * ring  # 2 (p-1) full-buffer hops against 2 (p-1)/p of the buffer

    def to_root(f: Fabric, world: int, n: int) -> None:  # every rank sends its whole buffer to rank 0 at once
        for r in range(1, world):
            _send(f, r, 1, 0, b"x" * n)
            _recv(f, 0, r, r, n)
        for r in range(1, world):
            _wait(f, 0, r)
    # rank 0's ingress port takes the 7 messages one after another
    assert modelled(to_root, world, n) == pytest.approx((world - 1) * n / 100e3 + MODEL.alpha_us)


def test_the_figure_does_not_depend_on_the_order_frames_arrived_in():
    """Two interleavings of the same per-rank programs: the coordinator reads ranks in whatever order their frames
    come; the model sees each rank's program order only."""
    def one_order(f: Fabric, world: int, n: int) -> None:
        ring_allreduce(f, world, n)

    def other_order(f: Fabric, world: int, n: int) -> None:
        chunk = n // world
        for step in range(2 * (world - 1)):
            h = step
            for r in reversed(range(world)):
                _recv(f, r, h * 10 + 2, (r - 1) % world, chunk)
            for r in reversed(range(world)):
                _send(f, r, h * 10 + 1, (r + 1) % world, b"x" * chunk)
                _wait(f, r, h * 10 + 1)
            for r in reversed(range(world)):
                _wait(f, r, h * 10 + 2)
    assert modelled(one_order, 5, 1_000_000) == modelled(other_order, 5, 1_000_000)


def test_data_arrives_only_on_wait_and_what_follows_a_wait_depends_on_it():
    f = Fabric(2, MODEL)
    f.open_window()
    assert _recv(f, 1, 1, 0, 8) == []
    assert _send(f, 0, 1, 1, b"abcdefgh") == []  # matched, but rank 1 has not asked for it
    assert _wait(f, 1, 1) == [(1, {"type": "net", "h": 1}, b"abcdefgh")]
    _send(f, 1, 2, 0, b"y" * 1_000_000)  # posted after the wait: starts when the first message has arrived
    _recv(f, 0, 2, 1, 1_000_000)
    _wait(f, 0, 2)
    call = f.close_window()
    first = 8 / 100e3 + 1.0
    assert call.time_us == pytest.approx(first + 1_000_000 / 100e3 + 1.0)
    assert call.messages == 2 and call.bytes_moved == 1_000_008


def test_sizes_that_disagree_and_mismatched_collectives_are_the_ranks_error():
    f = Fabric(2, MODEL)
    _recv(f, 1, 1, 0, 4)
    with pytest.raises(FabricError, match="size mismatch: rank 1 posted a receive of 4 bytes from rank 0"):
        _send(f, 0, 1, 1, b"12345678")
    f = Fabric(2, MODEL)
    _coll(f, 0, 1, "allreduce", b"\0" * 8, reduce="sum")
    with pytest.raises(FabricError, match="mismatched collectives: collective #1 on the world group is all_gather"):
        _coll(f, 1, 1, "allgather", b"\0" * 8)
    with pytest.raises(FabricError, match="itself"):
        _send(Fabric(2, MODEL), 0, 1, 0, b"")


def test_a_forbidden_operation_is_refused_by_the_coordinator_whatever_route_the_rank_took():
    f = Fabric(2, MODEL, forbidden_methods={"allreduce"})
    with pytest.raises(FabricError) as err:
        _coll(f, 0, 1, "allreduce", b"\0" * 4, reduce="sum")
    assert err.value.rule == "forbidden_api"
    g = Fabric(2, MODEL, forbidden_methods={"allreduce"}, harness_kinds={"allreduce"})
    assert _coll(g, 0, 1, "allreduce", b"\0" * 4, reduce="sum") == []  # the harness's own all-reduce is carried


def test_collectives_compute_in_the_coordinator_and_cost_the_ring_formula():
    f = Fabric(3, MODEL)
    f.open_window()
    xs = [torch.tensor([1.0, 2.0]) * (r + 1) for r in range(3)]
    for r in range(3):
        _coll(f, r, 7, "allreduce", xs[r].numpy().tobytes(), reduce="sum")
    out = [_wait(f, r, 7) for r in range(3)]
    for (rank, header, blob), r in zip((o[0] for o in out), range(3)):
        assert rank == r and torch.equal(torch.frombuffer(bytearray(blob), dtype=torch.float32), torch.tensor([6., 12.]))
    call = f.close_window()
    assert call.collectives == 1
    assert call.time_us == pytest.approx(MODEL.collective_us("allreduce", 3, 8))


def test_all_to_all_splits_must_agree_between_sender_and_receiver():
    f = Fabric(2, MODEL)
    _coll(f, 0, 1, "alltoall", b"\0" * 12, in_bytes=[4, 8], out_bytes=[4, 4])
    with pytest.raises(FabricError, match="split mismatch: rank 0 sends 2 elements to rank 1, which expects 1"):
        _coll(f, 1, 1, "alltoall", b"\0" * 8, in_bytes=[4, 4], out_bytes=[4, 4])


def test_a_deadlock_says_who_waits_for_what():
    f = Fabric(3, MODEL)
    _recv(f, 1, 5, 0, 16, tag=3)
    _wait(f, 1, 5)
    _coll(f, 2, 1, "barrier", b"")
    _wait(f, 2, 1)
    lines = f.stuck([1, 2])
    assert lines[0] == "rank 1 waits for a message from rank 0 (tag 3, 16 bytes) that it has not sent"
    assert "rank 2 waits in barrier (collective #1 of its group), which rank(s) 0, 1 never joined" in lines[1]


def test_a_message_to_a_busy_receiver_does_not_hold_the_senders_port():
    """Rank 0 keeps rank 1's ingress busy; rank 2 sends to rank 1 and to rank 3: whichever it posts first, the
    message to rank 3 goes at once (head-of-line blocking would make the first order 5 us slower)."""
    def drive(first: int):
        def run(f: Fabric, world: int, n: int) -> None:
            _send(f, 0, 1, 1, b"x" * n)  # rank 1's ingress busy for n / B
            _recv(f, 1, 1, 0, n)
            for h, dst in enumerate((first, 4 - first), start=10):  # to 1 then 3, or 3 then 1
                _send(f, 2, h, dst, b"y" * (n // 2))
                _recv(f, dst, h, 2, n // 2)
            for r, h in ((1, 1), (1, 10 if first == 1 else 11), (3, 11 if first == 1 else 10)):
                _wait(f, r, h)
        return run
    a, b = modelled(drive(1), 4, 1_000_000), modelled(drive(3), 4, 1_000_000)
    assert a == b == pytest.approx(1.5 * 1_000_000 / 100e3 + 1.0)


def test_each_message_holds_the_senders_port_for_the_overhead():
    model = LinkModel(port_gbps=100.0, alpha_us=1.0, overhead_us=0.5)
    f = Fabric(9, model)
    f.open_window()
    for dst in range(1, 9):  # eight empty messages posted at once
        _send(f, 0, dst, dst, b"")
        _recv(f, dst, 1, 0, 0)
    assert f.close_window().time_us == pytest.approx(8 * 0.5 + 1.0)


def test_simulate_of_no_traffic_is_zero():
    assert simulate([[], []], MODEL).time_us == 0.0
