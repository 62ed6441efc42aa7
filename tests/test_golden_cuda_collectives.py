"""The golden op of collective/allreduce_bf16_accum (a bit-exact bfloat16 all-reduce in a stated float32 order),
checked on the CPU against hand-made examples and against the orders it must reject."""

from __future__ import annotations

import pytest
import torch

from commbench_env.cards import CaseSpec, load_task
from commbench_env.golden import get_op
from commbench_env.golden.cuda_collectives import TRAP_PERIOD, ordered_fp32_sum

OP = "all_reduce_fp32_ordered"


def _bf16(*v: float) -> torch.Tensor:
    t = torch.tensor(v, dtype=torch.float64).to(torch.bfloat16)
    assert t.double().tolist() == list(v)  # the examples are exact in bfloat16
    return t


def _inputs(case, world, base=1000):
    op = get_op(OP)
    return [op.make_inputs(case, r, world, base + 17 * r) for r in range(world)]


def test_formula_on_the_prompts_examples():
    # 2^25 + 1 rounds to 2^25 in float32, so the -2^25 that follows cancels everything
    assert ordered_fp32_sum([_bf16(2.0**25), _bf16(1.0), _bf16(-(2.0**25))]).double().tolist() == [0.0]
    # 1 + 2^-8 is exact, + 2^-30 is lost, and 1 + 2^-8 is a tie that rounds to even (1) in bfloat16
    assert ordered_fp32_sum([_bf16(1.0), _bf16(2.0**-8), _bf16(2.0**-30)]).double().tolist() == [1.0]
    # the order matters: the same values starting from the small one
    assert ordered_fp32_sum([_bf16(1.0), _bf16(2.0**25), _bf16(-(2.0**25))]).double().tolist() == [0.0]
    assert ordered_fp32_sum([_bf16(2.0**25), _bf16(-(2.0**25)), _bf16(1.0)]).double().tolist() == [1.0]


def test_expected_is_the_formula_on_every_rank():
    op = get_op(OP)
    case = CaseSpec(name="c", shape=[3, 5], dtype="bfloat16")
    ins = _inputs(case, 3)
    exp = op.expected(case, 3, ins)
    acc = ins[0]["x"].float()
    for i in ins[1:]:
        acc = acc + i["x"].float()
    for e in exp:
        assert e["y"].dtype == torch.bfloat16 and torch.equal(e["y"], acc.to(torch.bfloat16))


def test_traps_are_public_pairs_and_the_rest_is_private():
    case = CaseSpec(name="c", shape=[TRAP_PERIOD + 777], dtype="bfloat16", params={"trap_fraction": 0.5})
    a = _inputs(case, 4, base=1)
    b = _inputs(case, 4, base=2)
    xa = torch.stack([i["x"].double() for i in a])
    xb = torch.stack([i["x"].double() for i in b])
    public = xa == xb  # the same for both seeds
    big = xa.abs() >= 2.0**14  # N(0,1) data never reaches 2^14: these are the traps
    assert bool(public[big].all())  # trap values are public ...
    assert float((public & ~big).double().mean()) < 0.05  # ... the rest is private (bf16 values coincide at times)
    per_pos = big.sum(0)
    assert set(per_pos.unique().tolist()) == {0, 2}  # a trap is a pair of ranks
    pairs = torch.where(big, xa, torch.zeros_like(xa)).sum(0)
    assert bool((pairs == 0).all())  # +2^e on one rank, -2^e on the other
    # the pattern repeats with the period, also over the partial last period
    assert torch.equal(big[:, :777], big[:, TRAP_PERIOD:])
    assert 0.4 < float((per_pos == 2).double().mean()) < 0.6


@pytest.mark.parametrize("world", [3, 4, 8])
def test_other_orders_and_precisions_fail(world):
    op = get_op(OP)
    case = CaseSpec(name="c", shape=[20011], dtype="bfloat16")
    ins = _inputs(case, world)
    xs = [i["x"] for i in ins]
    exp = op.expected(case, world, ins)[0]["y"].double()

    def wrong(y):
        return int((y.double() != exp).sum())

    f64 = torch.stack([x.double() for x in xs]).sum(0).to(torch.bfloat16)
    rev = ordered_fp32_sum(xs[::-1])
    own_first = ordered_fp32_sum([xs[2]] + xs[:2] + xs[3:])  # rank 2 starts with its own input
    hop = xs[0]
    for x in xs[1:]:
        hop = (hop.float() + x.float()).to(torch.bfloat16)
    for y in (f64, rev, own_first, hop):
        assert wrong(y) > 100
    if world >= 4:
        pairs = [x.float() for x in xs]
        while len(pairs) > 1:
            pairs = [pairs[i] + pairs[i + 1] if i + 1 < len(pairs) else pairs[i] for i in range(0, len(pairs), 2)]
        assert wrong(pairs[0].to(torch.bfloat16)) > 100
    assert wrong(ordered_fp32_sum(xs)) == 0


def test_verify_is_bit_exact():
    op = get_op(OP)
    case = CaseSpec(name="c", shape=[4099], dtype="bfloat16", params={"pattern_seed": 2})
    ins = _inputs(case, 4)
    good = op.expected(case, 4, ins)
    assert op.verify(case, 4, ins, good, (0.0, 0.0)) is None
    bad = [{"y": g["y"].clone()} for g in good]
    y = bad[3]["y"]
    y[1234] = (y[1234].float() * (1 + 2.0**-7)).to(torch.bfloat16) if float(y[1234]) != 0 else torch.tensor(2.0**-20)
    m = op.verify(case, 4, ins, bad, (0.0, 0.0))
    assert m is not None and m["rank"] == 3 and m["index"] == [1234]


def test_samples_match_the_whole_expectation():
    op = get_op(OP)
    case = CaseSpec(name="c", shape=[70001], dtype="bfloat16")
    ins = _inputs(case, 3)
    full = op.expected(case, 3, ins)
    picks = {r: torch.randint(0, 70001, (50,), generator=torch.Generator().manual_seed(r)) for r in range(3)}
    got = op.expected_samples(case, 3, ins, lambda r, name, n: picks[r])
    for r in range(3):
        assert torch.equal(got[r]["y"], full[r]["y"][picks[r]])


def test_card_must_ask_for_bit_exactness_and_bfloat16():
    op = get_op(OP)
    card = load_task("collective/allreduce_bf16_accum").card
    op.validate_card(card)
    loose = card.model_copy(update={"tolerance": {}})
    with pytest.raises(ValueError, match="bit-exactness"):
        op.validate_card(loose)
    with pytest.raises(ValueError, match="bfloat16"):
        op.validate_case(CaseSpec(name="c", shape=[4], dtype="float32"))
