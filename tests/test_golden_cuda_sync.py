"""Golden op of utility/peer_atomic_counter (peer_slot_append), checked on the CPU against plain-Python routing."""

from __future__ import annotations

import pytest
import torch

from commbench_env.cards import CaseSpec, PerformanceSpec
from commbench_env.golden import get_op

OP = get_op("peer_slot_append")


def _case(n, **params):
    return CaseSpec(name="t", shape=[n], dtype="int32", params=params)


def _inputs(case, world):
    return [OP.make_inputs(case, r, world, 4242 + 31 * r) for r in range(world)]


def _by_hand(inputs, world, shuffle_seed=0):
    """What a correct candidate may write: each rank's records in a shuffled order, then -1 rows."""
    cap = sum(len(i["dest"].tolist()) for i in inputs)
    g = torch.Generator().manual_seed(shuffle_seed)
    outs = []
    for r in range(world):
        rows = [row for i in inputs for row, d in zip(i["x"].tolist(), i["dest"].tolist()) if d == r]
        perm = torch.randperm(len(rows), generator=g).tolist()
        out = [[-1] * 4 for _ in range(cap)]
        for k, p in enumerate(perm):
            out[k] = rows[p]
        outs.append({"out": torch.tensor(out, dtype=torch.int32).reshape(cap, 4)})
    return outs


@pytest.mark.parametrize("world,n,params", [(2, 1, {}), (2, 7, {"drop": 0.3}), (4, 500, {"hot": 0.5}),
                                            (3, 64, {"target_rank": 1}), (8, 33, {"uneven": True}),
                                            (4, 20, {"empty_rank": 2}), (2, 10, {"drop": 1.0})])
def test_any_order_of_the_right_records_passes(world, n, params):
    case = _case(n, **params)
    inputs = _inputs(case, world)
    assert all((i["x"] != -1).all() for i in inputs)
    assert all(((i["dest"] >= -1) & (i["dest"] < world)).all() for i in inputs)
    for seed in (0, 1):
        assert OP.verify(case, world, inputs, _by_hand(inputs, world, seed), (0, 0)) is None
    exp = OP.expected(case, world, inputs)
    assert OP.verify(case, world, inputs, exp, (0, 0)) is None
    assert [tuple(e["out"].shape) for e in exp] == [(sum(i["dest"].numel() for i in inputs), 4)] * world


def test_case_params_route_as_stated():
    world = 4
    inputs = _inputs(_case(100, target_rank=5), world)
    assert all((i["dest"] == 1).all() for i in inputs)  # 5 mod 4
    inputs = _inputs(_case(100, empty_rank=6), world)
    assert inputs[2]["dest"].numel() == 0 and inputs[1]["dest"].numel() == 100
    inputs = _inputs(_case(2000, drop=1.0), world)
    assert all((i["dest"] == -1).all() for i in inputs)


def _mutate(outs, r, fn):
    outs = [{"out": o["out"].clone()} for o in outs]
    fn(outs[r]["out"])
    return outs


def test_lost_doubled_and_stray_rows_fail():
    world = 2
    case = _case(50)
    inputs = _inputs(case, world)
    good = _by_hand(inputs, world)
    m0 = sum(int((i["dest"] == 0).sum()) for i in inputs)
    assert m0 >= 2

    def hole(t):
        t[0] = -1

    def doubled(t):
        t[1] = t[0]

    def stray(t):
        t[m0] = t[0]

    def shifted(t):  # counter started at 1: rows 1 .. m0
        t[1:m0 + 1] = t[0:m0].clone()
        t[0] = -1

    def word_order(t):
        t[0] = t[0].flip(0)

    for fn, reason in ((hole, "semantics"), (doubled, "value"), (stray, "semantics"), (shifted, "semantics"),
                       (word_order, "value")):
        mm = OP.verify(case, world, inputs, _mutate(good, 0, fn), (0, 0))
        assert mm is not None and mm["rank"] == 0 and mm["reason"] == reason, (fn.__name__, mm)
    short = [{"out": o["out"][:-1]} for o in good]
    assert OP.verify(case, world, inputs, short, (0, 0))["reason"] == "shape"


@pytest.mark.parametrize("world", [2, 4])
def test_bench_samples_match_the_expected_rows(world):
    perf = PerformanceSpec(metric="algbw", sizes=[16 * 1000], dtype="int32")
    case = OP.size_case(perf, 16 * 1000, world)
    assert case.shape == [1000] and OP.metric_bytes(case, world) == 16000
    inputs = _inputs(case, world)
    full = _by_hand(inputs, world)  # any order: the rows are all alike
    picks = {}

    def pick(r, name, numel):
        picks[r] = torch.randint(0, numel, (300,), generator=torch.Generator().manual_seed(r))
        return picks[r]

    values = OP.expected_samples(case, world, inputs, pick)
    for r in range(world):
        assert torch.equal(values[r]["out"], full[r]["out"].reshape(-1)[picks[r]])
    shapes = OP.expected(case, world, inputs)
    assert tuple(shapes[0]["out"].shape) == (world * 1000, 4)
