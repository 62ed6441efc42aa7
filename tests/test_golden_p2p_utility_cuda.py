"""Golden ops of the flag-based CUDA tasks (ping-pong, barrier rounds, peer histogram), checked on the CPU against
independent plain-Python computations, and the judge's private peer buffers."""

from __future__ import annotations

import struct
from collections import Counter

import pytest
import torch

from commbench_env.cards import CaseSpec, load_task
from commbench_env.golden import get_op


def _i32(v: int) -> int:
    """The int32 with the low 32 bits of v (independent of the op's own wrapping helper)."""
    return struct.unpack("<i", struct.pack("<I", v % (1 << 32)))[0]


def _inputs(op, case, world, seeds=None):
    seeds = seeds or [1000 + 17 * r for r in range(world)]
    return [op.make_inputs(case, r, world, seeds[r]) for r in range(world)]


# ---- pingpong_chain --------------------------------------------------------------------------------------------
def _pingpong_by_hand(keys_ping: list[int], keys_pong: list[int]) -> tuple[list[int], list[int]]:
    """Plays the game message by message, as the prompt tells it."""
    got_ping, got_pong = [], []
    reply = 0
    for k in range(len(keys_ping)):
        msg = (reply + keys_ping[k]) % (1 << 32)     # pinger sends
        got_pong.append(_i32(msg))                   # ponger records
        reply = (msg + keys_pong[k]) % (1 << 32)     # ponger answers
        got_ping.append(_i32(reply))                 # pinger records
    return got_ping, got_pong


@pytest.mark.parametrize("world,rounds", [(2, 1), (2, 7), (4, 100), (8, 33)])
def test_pingpong_matches_a_game_played_by_hand(world, rounds):
    op = get_op("pingpong_chain")
    case = CaseSpec(name="c", shape=[rounds], dtype="int32")
    inputs = _inputs(op, case, world)
    exp = op.expected(case, world, inputs)
    for ping in range(0, world, 2):
        a, b = _pingpong_by_hand(inputs[ping]["x"].tolist(), inputs[ping + 1]["x"].tolist())
        assert exp[ping]["y"].dtype == torch.int32 and exp[ping]["y"].tolist() == a
        assert exp[ping + 1]["y"].tolist() == b


def test_pingpong_keys_are_full_range_and_private_per_rank():
    op = get_op("pingpong_chain")
    case = CaseSpec(name="c", shape=[4096], dtype="int32")
    x0, x1 = (t["x"] for t in _inputs(op, case, 2))
    assert x0.dtype == torch.int32 and not torch.equal(x0, x1)
    assert int(x0.min()) < -(1 << 30) and int(x0.max()) > (1 << 30)  # wraps modulo 2^32 in practice


def test_pingpong_detects_a_skipped_round_and_a_stale_ball():
    op = get_op("pingpong_chain")
    case = CaseSpec(name="c", shape=[50], dtype="int32")
    inputs = _inputs(op, case, 2)
    good = op.expected(case, 2, inputs)
    assert op.verify(case, 2, inputs, good, (0.0, 0.0)) is None
    stale = [{"y": good[0]["y"].clone()}, {"y": good[1]["y"].clone()}]
    stale[1]["y"][10] = stale[1]["y"][9]  # the ponger saw last round's ball again
    m = op.verify(case, 2, inputs, stale, (0.0, 0.0))
    assert m and m["rank"] == 1 and m["index"] == [10]


def test_pingpong_cases_and_worlds():
    op = get_op("pingpong_chain")
    assert op.supports_world(2, None) and op.supports_world(8, None) and not op.supports_world(3, None)
    for bad in (CaseSpec(name="c", shape=[0], dtype="int32"), CaseSpec(name="c", shape=[65536], dtype="int32"),
                CaseSpec(name="c", shape=[10], dtype="float32"), CaseSpec(name="c", shape=[2, 5], dtype="int32")):
        with pytest.raises(ValueError):
            op.validate_case(bad)
    perf = load_task("p2p/pingpong_flags").card.performance
    bench = op.size_case(perf, 512, 4)
    assert bench.shape == [128] and bench.dtype == "int32" and op.metric_bytes(bench, 4) == 512


# ---- barrier_rounds --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("world", [2, 4, 8])
def test_barrier_rounds_output_is_every_ranks_value_per_round(world, dtype):
    op = get_op("barrier_rounds")
    rounds = 9
    case = CaseSpec(name="c", shape=[rounds], dtype=dtype)
    inputs = _inputs(op, case, world)
    exp = op.expected(case, world, inputs)
    for r in range(world):
        y = exp[r]["y"]
        assert y.shape == (world * rounds,)
        for q in range(world):
            for k in range(rounds):
                assert y[q * rounds + k].item() == inputs[q]["x"][k].item()  # out[q * rounds + k] = x_q[k]


def test_barrier_rounds_catches_a_stale_read():
    op = get_op("barrier_rounds")
    case = CaseSpec(name="c", shape=[8], dtype="float32")
    inputs = _inputs(op, case, 4)
    out = [{"y": e["y"].clone()} for e in op.expected(case, 4, inputs)]
    out[2]["y"][1 * 8 + 5] = inputs[1]["x"][3]  # rank 2 read rank 1's slot of round 3 in round 5
    m = op.verify(case, 4, inputs, out, (1e-4, 1e-5))
    assert m and m["rank"] == 2 and m["index"] == [13]


def test_barrier_rounds_sizes_mean_rounds_at_every_world():
    op = get_op("barrier_rounds")
    perf = load_task("utility/flag_barrier").card.performance
    for world in (2, 4, 8):
        assert [op.size_case(perf, s, world).shape for s in perf.gpu_sizes] == [[1], [128], [2048]]
    with pytest.raises(ValueError):
        op.validate_case(CaseSpec(name="c", shape=[65536], dtype="float32"))


# ---- peer_histogram --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world,params", [
    (2, {"bins": 1}), (4, {"bins": 3}), (8, {"bins": 64, "hot": 0.5}), (4, {"bins": 100, "uneven": True}),
    (2, {"bins": 17, "empty_rank": 1}), (8, {"bins": 1024, "hot": 1.0}),
])
def test_peer_histogram_matches_counting_by_hand(world, params):
    op = get_op("peer_histogram")
    case = CaseSpec(name="c", shape=[3001], dtype="int32", params=params)
    op.validate_case(case)
    inputs = _inputs(op, case, world)
    bins = params["bins"]
    counts = Counter(v for i in inputs for v in i["x"].tolist())
    assert all(0 <= g < world * bins for g in counts)
    exp = op.expected(case, world, inputs)
    for r in range(world):
        assert exp[r]["y"].dtype == torch.int32
        assert exp[r]["y"].tolist() == [counts.get(r * bins + j, 0) for j in range(bins)]
    assert sum(int(e["y"].sum()) for e in exp) == sum(i["x"].numel() for i in inputs)


def test_peer_histogram_lengths_and_hot_bins():
    op = get_op("peer_histogram")
    case = CaseSpec(name="c", shape=[4097], dtype="int32", params={"bins": 17, "empty_rank": 1})
    assert [i["x"].numel() for i in _inputs(op, case, 4)] == [4097, 0, 4097, 4097]
    case = CaseSpec(name="c", shape=[500], dtype="int32", params={"bins": 50, "uneven": True})
    lengths = {i["x"].numel() for i in _inputs(op, case, 8)}
    assert len(lengths) > 1 and all(0 <= n <= 500 for n in lengths)
    # hot bins are the same on every rank (contention on the same counters), whatever the rank's seed
    case = CaseSpec(name="c", shape=[2000], dtype="int32", params={"bins": 1000, "hot": 1.0})
    hot = [set(i["x"].tolist()) for i in _inputs(op, case, 4)]
    assert all(h == hot[0] for h in hot) and len(hot[0]) <= op.HOT_BINS


def test_peer_histogram_rejects_bad_cases():
    op = get_op("peer_histogram")
    for params in ({}, {"bins": 0}, {"bins": 2.5}, {"bins": 4, "hot": 1.5}, {"bins": 4, "empty_rank": "x"}):
        with pytest.raises(ValueError):
            op.validate_case(CaseSpec(name="c", shape=[10], dtype="int32", params=params))
    with pytest.raises(ValueError):
        op.validate_case(CaseSpec(name="c", shape=[10], dtype="float32", params={"bins": 4}))
    perf = load_task("utility/peer_atomic_histogram").card.performance
    bench = op.size_case(perf, 65536, 8)
    assert bench.shape == [16384] and bench.params["bins"] == 512 and op.metric_bytes(bench, 8) == 65536


# ---- the judge's private peer buffers --------------------------------------------------------------------------
def _cb_args_for(task_id: str, world: int = 2):
    from commbench_env.judge.candidate.device_host import DeviceHost

    card = load_task(task_id).card
    host = DeviceHost.__new__(DeviceHost)  # no GPU here: only the argument packing is exercised
    host.world, host.devices = world, [0] * world
    host.cuda = card.cuda.model_dump(mode="json")
    case = card.cases[0]
    bufs = [{"inputs": {"x": torch.zeros(4)}, "outs": {"y": torch.zeros(4)}, "scratch": torch.zeros(64),
             "flags": torch.zeros(8, dtype=torch.int32)} for _ in range(world)]
    return host.args_for(case, bufs), bufs


def test_private_peer_buffers_are_null_and_own_buffers_are_set():
    args, bufs = _cb_args_for("p2p/ll_ring_shift")
    for r, a in enumerate(args):
        other = 1 - r
        assert a.peer_in[r] == bufs[r]["inputs"]["x"].data_ptr() and a.peer_out[r] == bufs[r]["outs"]["y"].data_ptr()
        assert a.peer_in[other] is None and a.peer_out[other] is None
        assert a.peer_scratch[other] == bufs[other]["scratch"].data_ptr()
        assert a.peer_flags[other] == bufs[other]["flags"].data_ptr()
    args, bufs = _cb_args_for("p2p/tma_bulk_push")
    assert args[0].peer_in[1] is None and args[0].peer_out[1] == bufs[1]["outs"]["y"].data_ptr()


def test_peer_buffers_default_to_all_shared():
    args, bufs = _cb_args_for("p2p/ipc_pull_copy")
    assert args[0].peer_in[1] == bufs[1]["inputs"]["x"].data_ptr()
    assert args[1].peer_out[0] == bufs[0]["outs"]["y"].data_ptr()


def test_agent_view_says_which_peer_buffers_are_private():
    view = load_task("utility/flag_barrier").agent_view()
    assert "`args->peer_in[p]` and `args->peer_out[p]` are NULL for every p != rank" in view
    assert "are NULL for every p != rank" not in load_task("p2p/ipc_push_copy").agent_view().split("## commbench.h")[0]
