"""Golden ops of p2p/halo_exchange_2d_cuda (halo_exchange_2d_grid) and p2p/peer_gather_indexed
(peer_gather_rows), checked on the CPU against hand-made examples and plain-Python computations (issue #23)."""

from __future__ import annotations

import pytest
import torch

from commbench_env.cards import CaseSpec, PerformanceSpec, load_task
from commbench_env.golden import get_op


def _inputs(op, case, world):
    return [op.make_inputs(case, r, world, 4242 + 31 * r) for r in range(world)]


def _samples_match(op, case, world, inputs):
    """expected_samples gives expected's values at the positions it is asked for."""
    exp = op.expected(case, world, inputs)
    asked = {}

    def pick(r, name, numel):
        asked[r] = torch.randint(0, numel, (97,), generator=torch.Generator().manual_seed(r))
        return asked[r]

    got = op.expected_samples(case, world, inputs, pick)
    for r in range(world):
        assert torch.equal(got[r]["y"], exp[r]["y"].reshape(-1)[asked[r]])


# ---- halo_exchange_2d_grid -------------------------------------------------------------------------------------
def _halo(shape, dtype="float32", **params):
    return CaseSpec(name="c", shape=shape, dtype=dtype, params={"width": shape[1], **params})


def test_halo_prompt_example():
    op = get_op("halo_exchange_2d_grid")
    case = _halo([2, 2], halo=1, grid_cols=2, periodic=False, fill=0)
    inputs = [{"x": torch.tensor([[10. * r + 1, 10 * r + 2], [10 * r + 3, 10 * r + 4]])} for r in range(4)]
    exp = op.expected(case, 4, inputs)
    assert exp[0]["y"].tolist() == [[0, 0, 0, 0], [0, 1, 2, 11], [0, 3, 4, 13], [0, 21, 22, 31]]
    assert exp[3]["y"].tolist() == [[4, 13, 14, 0], [22, 31, 32, 0], [24, 33, 34, 0], [0, 0, 0, 0]]


def _halo_by_hand(case, world, inputs, r):
    hh, ww = case.shape
    h, q = case.params["halo"], case.params["grid_cols"]
    p, (i, j) = world // q, divmod(r, q)
    out = []
    for a in range(hh + 2 * h):
        row = []
        for b in range(ww + 2 * h):
            gr, gc = i * hh - h + a, j * ww - h + b
            if case.params["periodic"]:
                gr, gc = gr % (p * hh), gc % (q * ww)
            if 0 <= gr < p * hh and 0 <= gc < q * ww:
                row.append(inputs[(gr // hh) * q + gc // ww]["x"][gr % hh, gc % ww].item())
            else:
                row.append(case.params["fill"])
        out.append(row)
    return out


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("shape,params,dtype", [
    ([4, 5], dict(halo=2, grid_cols=2, periodic=False, fill=7), "float32"),
    ([3, 3], dict(halo=3, grid_cols=1, periodic=True, fill=0), "int32"),
    ([2, 6], dict(halo=1, grid_cols=2, periodic=True, fill=0), "uint8"),
    ([5, 2], dict(halo=2, grid_cols=1, periodic=False, fill=-3), "bfloat16"),
    ([1, 1], dict(halo=1, grid_cols=2, periodic=False, fill=4), "int64"),
    ([3, 4], dict(halo=0, grid_cols=2, periodic=False, fill=1), "float16"),
])
def test_halo_matches_the_definition(world, shape, params, dtype):
    op = get_op("halo_exchange_2d_grid")
    case = _halo(shape, dtype, **params)
    op.validate_case(case)
    inputs = _inputs(op, case, world)
    exp = op.expected(case, world, inputs)
    for r in range(world):
        y = exp[r]["y"]
        assert y.dtype == getattr(torch, dtype) and list(y.shape) == [shape[0] + 2 * params["halo"],
                                                                      shape[1] + 2 * params["halo"]]
        assert y.tolist() == _halo_by_hand(case, world, inputs, r)
    _samples_match(op, case, world, inputs)


def test_halo_grid_cols_must_divide_the_world():
    op = get_op("halo_exchange_2d_grid")
    case = _halo([4, 4], halo=1, grid_cols=4, periodic=True, fill=0)
    assert op.supports_world(4, case) and op.supports_world(8, case) and not op.supports_world(2, case)


@pytest.mark.parametrize("params,match", [
    (dict(halo=5, grid_cols=1), "halo"),
    (dict(halo=1, grid_cols=0), "grid_cols"),
    (dict(halo=1, grid_cols=1, fill=101), "fill"),
    (dict(halo=1, grid_cols=1, width=5), "width"),
    (dict(halo=1, grid_cols=1, colour=1), "unknown"),
])
def test_halo_rejects_bad_cases(params, match):
    case = CaseSpec(name="c", shape=[4, 4], dtype="float32", params={"width": 4, **params})
    with pytest.raises(ValueError, match=match):
        get_op("halo_exchange_2d_grid").validate_case(case)


def test_halo_uint8_fill_must_be_a_byte():
    with pytest.raises(ValueError, match="fill"):
        get_op("halo_exchange_2d_grid").validate_case(_halo([4, 4], "uint8", halo=1, grid_cols=1, fill=-1))


@pytest.mark.parametrize("world,cols", [(2, 1), (4, 2), (8, 2)])
def test_halo_benchmark_case_is_aligned_and_sized(world, cols):
    op = get_op("halo_exchange_2d_grid")
    perf = load_task("p2p/halo_exchange_2d_cuda").card.performance
    case = op.size_case(perf, 64 << 20, world)
    h = case.params["halo"]
    assert case.shape == [4 * h, 4 * h] and h == 912 and case.params["grid_cols"] == cols
    assert case.params["periodic"] and (h * 4) % 16 == 0
    assert op.metric_bytes(case, world) == 20 * h * h * 4 <= 64 << 20
    assert abs(perf.roofline_bound - 20 / 36) < 1e-3


def test_halo_open_metric_counts_only_cells_inside_the_domain():
    op = get_op("halo_exchange_2d_grid")
    case = _halo([4, 4], halo=1, grid_cols=2, periodic=False, fill=0)
    # a 2 x 2 grid: every rank has one corner and two edges inside G, 4 + 4 + 1 cells
    assert op.metric_bytes(case, 4) == 9 * 4


def test_halo_wrong_neighbour_is_caught():
    op = get_op("halo_exchange_2d_grid")
    case = _halo([8, 8], "bfloat16", halo=2, grid_cols=2, periodic=True, fill=0)
    inputs = _inputs(op, case, 4)
    exp = op.expected(case, 4, inputs)
    bad = [{"y": e["y"].clone()} for e in exp]
    bad[0]["y"][0:2, 0:2] = bad[0]["y"][0:2, 10:12]  # the top-left corner from the top-right neighbour
    assert op.verify(case, 4, inputs, bad, (0.0, 0.0))
    assert op.verify(case, 4, inputs, exp, (0.0, 0.0)) is None


# ---- peer_gather_rows ------------------------------------------------------------------------------------------
def test_gather_prompt_example():
    op = get_op("peer_gather_rows")
    case = CaseSpec(name="c", shape=[2, 2], dtype="float32", params={"lookups": 4})
    inputs = [{"table": torch.tensor([[1., 2.], [3., 4.]]), "ids": torch.tensor([3, 0, -1, 3])},
              {"table": torch.tensor([[5., 6.], [7., 8.]]), "ids": torch.tensor([2, 2, 1, 0])}]
    exp = op.expected(case, 2, inputs)
    assert exp[0]["y"].tolist() == [[7, 8], [1, 2], [0, 0], [7, 8]]
    assert exp[1]["y"].tolist() == [[5, 6], [5, 6], [3, 4], [1, 2]]


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("shape,params,dtype", [
    ([5, 3], dict(lookups=40), "float32"),
    ([1, 1], dict(lookups=9, pad=0.3), "uint8"),
    ([16, 7], dict(lookups=100, skew=1.5, pad=0.1), "bfloat16"),
    ([8, 4], dict(lookups=30, owner=1), "int64"),
])
def test_gather_matches_the_definition(world, shape, params, dtype):
    op = get_op("peer_gather_rows")
    case = CaseSpec(name="c", shape=shape, dtype=dtype, params=params)
    op.validate_case(case)
    inputs = _inputs(op, case, world)
    exp = op.expected(case, world, inputs)
    rows = [row for inp in inputs for row in inp["table"].tolist()]
    for r in range(world):
        ids = inputs[r]["ids"]
        assert ids.dtype == torch.int64 and ids.numel() == params["lookups"]
        assert bool(((ids >= -1) & (ids < world * shape[0])).all())
        if "owner" in params:
            k = params["owner"] % world
            assert bool(((ids >= k * shape[0]) & (ids < (k + 1) * shape[0])).all())
        want = [rows[i] if i >= 0 else [0] * shape[1] for i in ids.tolist()]
        assert exp[r]["y"].dtype == getattr(torch, dtype) and exp[r]["y"].tolist() == want
    _samples_match(op, case, world, inputs)


def test_gather_ids_are_private_and_skew_makes_duplicates():
    op = get_op("peer_gather_rows")
    case = CaseSpec(name="c", shape=[256, 4], dtype="float32", params={"lookups": 512, "skew": 1.5, "pad": 0.25})
    a, b = _inputs(op, case, 2)
    assert not torch.equal(a["ids"], b["ids"])
    pad = float((a["ids"] < 0).double().mean())
    assert 0.15 < pad < 0.35
    assert a["ids"][a["ids"] >= 0].unique().numel() < 200  # hot rows repeat
    full = op.make_inputs(CaseSpec(name="c", shape=[4, 4], dtype="float32", params={"lookups": 50, "pad": 1.0}), 0,
                          2, 1)
    assert bool((full["ids"] == -1).all())


def test_gather_zero_rows_and_wrong_rows_are_caught():
    op = get_op("peer_gather_rows")
    case = CaseSpec(name="c", shape=[64, 16], dtype="bfloat16", params={"lookups": 200, "pad": 0.2})
    inputs = _inputs(op, case, 2)
    exp = op.expected(case, 2, inputs)
    assert op.verify(case, 2, inputs, exp, (0.0, 0.0)) is None
    ids = inputs[1]["ids"]
    m = int((ids >= 0).nonzero()[0])
    bad = [{"y": e["y"].clone()} for e in exp]
    bad[1]["y"][m] = inputs[1]["table"][0]  # a local row instead of the one asked for
    got = op.verify(case, 2, inputs, bad, (0.0, 0.0))
    assert got and got["rank"] == 1
    pad_row = int((ids < 0).nonzero()[0])
    nan = [{"y": e["y"].clone()} for e in exp]
    nan[1]["y"][pad_row] = float("nan")  # a -1 row left unwritten
    assert op.verify(case, 2, inputs, nan, (0.0, 0.0))


@pytest.mark.parametrize("params,match", [
    (dict(), "lookups"),
    (dict(lookups=0), "lookups"),
    (dict(lookups=4, pad=1.5), "pad"),
    (dict(lookups=4, hidden=3), "hidden"),
    (dict(lookups=4, colour=1), "unknown"),
])
def test_gather_rejects_bad_cases(params, match):
    with pytest.raises(ValueError, match=match):
        get_op("peer_gather_rows").validate_case(CaseSpec(name="c", shape=[4, 8], dtype="float32", params=params))


def test_gather_benchmark_case():
    op = get_op("peer_gather_rows")
    perf = load_task("p2p/peer_gather_indexed").card.performance
    case = op.size_case(perf, 64 << 20, 4)
    assert case.shape == [8192, 4096] and case.params["lookups"] == 8192 and case.dtype == "bfloat16"
    assert op.metric_bytes(case, 4) == 64 << 20
    small = op.size_case(PerformanceSpec(sizes=[100], dtype="float32", params={"hidden": 64}), 100, 2)
    assert small.params["lookups"] == 1 and small.shape == [1, 64]


@pytest.mark.parametrize("task", ["p2p/halo_exchange_2d_cuda", "p2p/peer_gather_indexed"])
def test_cards_share_inputs_and_cover_every_world(task):
    t = load_task(task)
    card = t.card
    assert "in" in card.cuda.peer_buffers  # the data reaches other ranks only through peer loads of x
    op = get_op(card.semantics.op)
    for w in card.world.sizes:
        assert sum(op.supports_world(w, c) for c in card.cases if not c.visible) >= 5
        assert any(op.supports_world(w, c) for c in card.visible_cases())
