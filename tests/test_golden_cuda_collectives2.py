"""Golden semantics of collective/reduce_to_root (`reduce_sum_root`) and the card of collective/alltoallv_ipc (which
reuses `all_to_all_v_counts`), checked on the CPU; plus emulations, in Python, of how the two CUDA references cut
their work (slices of the root's output; offsets from the count table and equal byte shares of the payload), run
against the golden outputs."""

from __future__ import annotations

import math

import pytest
import torch

from commbench_env.cards import CaseSpec, load_task
from commbench_env.golden import get_op

REDUCE = "reduce_sum_root"
A2AV_TASK = "collective/alltoallv_ipc"


def _ins(op, case, world, base=100):
    return [op.make_inputs(case, r, world, base + 31 * r) for r in range(world)]


# ---- reduce_sum_root -------------------------------------------------------------------------------------------
def test_reduce_prompt_example_and_empty_non_roots():
    op = get_op(REDUCE)
    case = CaseSpec(name="c", shape=[2], dtype="float32", params={"root": 2})
    ins = [{"x": torch.tensor([1.0, 2.0])}, {"x": torch.tensor([10.0, 20.0])}, {"x": torch.tensor([100.0, 200.0])}]
    exp = op.expected(case, 3, ins)
    assert exp[2]["y"].tolist() == [111.0, 222.0]
    assert exp[0]["y"].numel() == 0 and exp[1]["y"].numel() == 0
    # a non-root's output buffer is empty and typed like the root's (float outputs stay float64 in the golden)
    assert exp[0]["y"].is_floating_point()


@pytest.mark.parametrize("root,world,want", [(-1, 4, 3), (-2, 3, 1), (1, 2, 1), (0, 8, 0)])
def test_reduce_negative_roots(root, world, want):
    op = get_op(REDUCE)
    case = CaseSpec(name="c", shape=[5], dtype="float32", params={"root": root})
    assert op.supports_world(world, case)
    exp = op.expected(case, world, _ins(op, case, world))
    assert [r for r in range(world) if exp[r]["y"].numel()] == [want]


def test_reduce_root_outside_world_is_skipped_and_bad_params_rejected():
    op = get_op(REDUCE)
    assert not op.supports_world(2, CaseSpec(name="c", shape=[3], params={"root": 2}))
    assert not op.supports_world(2, CaseSpec(name="c", shape=[3], params={"root": -3}))
    with pytest.raises(ValueError):
        op.validate_case(CaseSpec(name="c", shape=[3], params={"root": 1.0}))
    with pytest.raises(ValueError):
        op.validate_case(CaseSpec(name="c", shape=[3], params={"rot": 1}))
    with pytest.raises(ValueError):
        op.validate_case(CaseSpec(name="c", shape=[], params={}))


def test_reduce_verify_checks_the_root_only():
    op = get_op(REDUCE)
    world = 4
    case = CaseSpec(name="c", shape=[3, 7], dtype="bfloat16", params={"root": -1})
    ins = _ins(op, case, world)
    tol = (2e-2, 6e-2)
    acc = ins[0]["x"].float()
    for i in ins[1:]:
        acc = acc + i["x"].float()
    good = [{"y": torch.empty(0, dtype=torch.bfloat16)} for _ in range(world)]
    good[3] = {"y": acc.to(torch.bfloat16)}
    assert op.verify(case, world, ins, good, tol) is None
    missing = [dict(o) for o in good]
    missing[3] = {"y": (acc - ins[1]["x"].float()).to(torch.bfloat16)}  # rank 1's contribution left out
    m = op.verify(case, world, ins, missing, tol)
    assert m is not None and m["rank"] == 3
    nan = [dict(o) for o in good]
    nan[3] = {"y": torch.full_like(acc, float("nan")).to(torch.bfloat16)}  # nobody wrote the root's output
    assert op.verify(case, world, ins, nan, tol) is not None


def test_reduce_int32_sums_are_exact_and_float32_would_fail():
    op = get_op(REDUCE)
    card = load_task("collective/reduce_to_root").card
    case = next(c for c in card.cases if c.dtype == "int32")
    world = 8
    ins = _ins(op, case, world)
    exp = op.expected(case, world, ins)[case.params["root"]]["y"]
    assert exp.dtype == torch.int32
    exact = torch.stack([i["x"].long() for i in ins]).sum(0)
    assert torch.equal(exp.long(), exact) and int(exact.abs().max()) < 2**31
    f32 = ins[0]["x"].float()
    for i in ins[1:]:
        f32 = f32 + i["x"].float()
    assert int((f32.long() != exact).sum()) > 0  # the case's range defeats a float32 accumulation


def test_reduce_expected_samples_match_expected():
    op = get_op(REDUCE)
    world = 3
    case = CaseSpec(name="c", shape=[1000], dtype="float32", params={"root": 1})
    ins = _ins(op, case, world)
    full = op.expected(case, world, ins)
    drawn = {}

    def pick(rank, name, numel):
        drawn[rank] = numel
        return torch.arange(0, numel, 7)

    got = op.expected_samples(case, world, ins, pick)
    assert drawn == {0: 0, 1: 1000, 2: 0}
    assert torch.allclose(got[1]["y"], full[1]["y"][::7])
    assert got[0]["y"].numel() == 0 and got[2]["y"].numel() == 0


def test_reduce_card_cases_validate_and_bench_case():
    op = get_op(REDUCE)
    card = load_task("collective/reduce_to_root").card
    for c in card.cases:
        op.validate_case(c)
    assert any(c.visible for c in card.cases) and any(not c.visible for c in card.cases)
    bench = op.size_case(card.performance, 64 << 20, 4)
    assert bench.shape == [16 << 20] and bench.params == {"root": 1}
    assert op.metric_bytes(bench, 4) == 64 << 20


def _reduce_slices(n: int, esize: int, world: int, root: int, one_gpu: bool, aligned: bool = True):
    """The element ranges each rank of reduce_to_root/reference.cu writes into the root's output."""
    skip_root = not one_gpu and world > 2
    reducers = world - 1 if skip_root else world
    out = {}
    for rank in range(world):
        if skip_root and rank == root:
            continue
        idx = (rank - root - 1) % world if skip_root else rank
        if aligned:
            per = 16 // esize
            allp = n // per
            p0, p1 = allp * idx // reducers, allp * (idx + 1) // reducers
            rest = n - allp * per if idx == reducers - 1 else 0
            out[rank] = (p0 * per, p1 * per + rest)
        else:
            out[rank] = (n * idx // reducers, n * (idx + 1) // reducers)
    return out


@pytest.mark.parametrize("n", [1, 3, 7, 15, 16, 17, 4099, 65536, 1048583])
@pytest.mark.parametrize("esize", [2, 4, 8])
@pytest.mark.parametrize("world,root", [(2, 1), (3, 0), (4, 3), (8, 5)])
@pytest.mark.parametrize("one_gpu", [True, False])
@pytest.mark.parametrize("aligned", [True, False])
def test_reference_slices_cover_the_root_output_once(n, esize, world, root, one_gpu, aligned):
    slices = _reduce_slices(n, esize, world, root, one_gpu, aligned)
    hit = torch.zeros(n, dtype=torch.int32)
    for lo, hi in slices.values():
        assert 0 <= lo <= hi <= n
        hit[lo:hi] += 1
        if aligned:
            assert lo * esize % 16 == 0  # every slice starts on a 16-byte pack
    assert bool((hit == 1).all())
    if not one_gpu and world > 2:
        assert root not in slices


# ---- alltoallv_ipc (all_to_all_v_counts) -----------------------------------------------------------------------
def test_alltoallv_card_states_the_row_length_of_every_case():
    card = load_task(A2AV_TASK).card
    op = get_op(card.semantics.op)
    assert card.cuda.params == ["row"]
    for c in card.cases:
        assert c.params.get("row") == math.prod(int(s) for s in c.shape[1:]), c.name
        assert c.dtype in ("float32", "bfloat16", "float64", "int32", "int64", "uint8", "float16"), c.name
    for world in card.world.sizes:
        for size in card.performance.gpu_sizes:
            bench = op.size_case(card.performance, size, world)
            assert bench.params["row"] == bench.shape[1]


def _emulate_alltoallv(inputs, world: int, row: int, esize: int, grids: list[int]):
    """What alltoallv_ipc/reference.cu writes: every rank's y (bytes) and recv_counts, from the count table and
    the equal byte shares of the end-to-end payload, with rank r's grid of grids[r] blocks."""
    counts = [[int(v) for v in i["send_counts"].tolist()] for i in inputs]  # the table, row s = rank s
    rb = row * esize
    ys = [bytearray(b"\xee" * (sum(counts[s][r] for s in range(world)) * rb)) for r in range(world)]
    written = [torch.zeros(len(y), dtype=torch.int32) for y in ys]
    recv = []
    for me in range(world):
        x = inputs[me]["x"].contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
        segs = []
        for i in range(world):
            j = (me + 1 + i) % world
            before = sum(counts[q][j] for q in range(me))
            first = sum(counts[me][:j])
            segs.append((first * rb, before * rb, counts[me][j] * rb, j))
        total = sum(s[2] for s in segs)
        G = grids[me]
        for b in range(G):
            lo = (total // 16 * b // G) * 16
            hi = total if b + 1 == G else (total // 16 * (b + 1) // G) * 16
            start = 0
            for src, dst, ln, j in segs:
                s, e = max(lo, start), min(hi, start + ln)
                if s < e:
                    at = s - start
                    ys[j][dst + at:dst + at + e - s] = x[src + at:src + at + e - s]
                    written[j][dst + at:dst + at + e - s] += 1
                start += ln
        recv.append([counts[q][me] for q in range(world)])
    return ys, recv, written


@pytest.mark.parametrize("name", ["uniform-f32", "skewed-odd-rows-bf16", "hot-receiver-f32", "empty-sender-int64",
                                  "nothing-at-all-f32", "three-byte-rows-u8", "very-skewed-bf16", "one-row-pairs-f32"])
@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_reference_offsets_and_shares_give_the_golden_outputs(name, world):
    card = load_task(A2AV_TASK).card
    op = get_op(card.semantics.op)
    case = next(c for c in card.cases if c.name == name)
    ins = _ins(op, case, world, base=7 + world)
    row = int(case.params["row"])
    esize = ins[0]["x"].element_size()
    grids = [1 + (3 * r + world) % 7 for r in range(world)]  # ranks may launch different grids
    ys, recv, written = _emulate_alltoallv(ins, world, row, esize, grids)
    exp = op.expected(case, world, ins)
    for r in range(world):
        want = exp[r]["y"].contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
        assert bytes(ys[r]) == want, (name, world, r)
        assert bool((written[r] == 1).all())  # every byte of y written exactly once
        assert recv[r] == exp[r]["recv_counts"].tolist()


def test_alltoallv_bench_counts_receive_about_the_same():
    card = load_task(A2AV_TASK).card
    op = get_op(card.semantics.op)
    world = 4
    bench = op.size_case(card.performance, 16 << 20, world)
    ins = [op.make_inputs(bench, r, world, 5 + r) for r in range(world)]
    exp = op.expected(bench, world, ins)
    totals = [int(e["recv_counts"].sum()) for e in exp]
    assert max(totals) - min(totals) <= world
    assert op.metric_bytes(bench, world) == ins[0]["x"].numel() * 4
