"""Golden op of collective/allreduce_fp8 (all_reduce_fp8_blockwise), checked on the CPU with schemes emulated in
torch's float8 types: e4m3 with a scale per block, rounded where a value starts and once more after the sum, meets
the bound; one scale per tensor, e5m2, int8 blocks and blocks four times too large do not."""

from __future__ import annotations

import pytest
import torch

from commbench_env.cards import CaseSpec, load_task
from commbench_env.golden import get_op

OP = get_op("all_reduce_fp8_blockwise")


def _q(x, block, fmt=torch.float8_e4m3fn, per_tensor=False):
    """x rounded to `fmt` with a scale per block (max |x| of the block maps to the format's largest value)."""
    n = x.numel()
    nb = -(-n // block)
    v = torch.zeros(nb * block, dtype=torch.float32)
    v[:n] = x.float()
    v = v.view(nb, block)
    fmax = torch.finfo(fmt).max
    amax = v.abs().amax() .expand(nb, 1) if per_tensor else v.abs().amax(1, keepdim=True)
    inv = torch.where(amax > 0, fmax / amax, torch.zeros_like(amax))
    return ((v * inv).clamp(-fmax, fmax).to(fmt).float() * (amax / fmax)).reshape(-1)[:n]


def _int8(x, block):
    n = x.numel()
    nb = -(-n // block)
    v = torch.zeros(nb * block)
    v[:n] = x.float()
    v = v.view(nb, block)
    s = v.abs().amax(1, keepdim=True) / 127
    return torch.where(s > 0, torch.round(v / s.clamp_min(1e-38)) * s, torch.zeros_like(v)).reshape(-1)[:n]


SCHEMES = {
    "two_stage": lambda xs, b: _q(sum(_q(x, b) for x in xs), b),
    "one_shot": lambda xs, b: sum(_q(x, b) for x in xs),
    "per_tensor": lambda xs, b: _q(sum(_q(x, b, per_tensor=True) for x in xs), b, per_tensor=True),
    "e5m2": lambda xs, b: _q(sum(_q(x, b, torch.float8_e5m2) for x in xs), b, torch.float8_e5m2),
    "int8": lambda xs, b: _int8(sum(_int8(x, b) for x in xs), b),
    "blocks_4x": lambda xs, b: _q(sum(_q(x, 4 * b) for x in xs), 4 * b),
}


def _run(case, world, scheme, seed=5):
    inputs = [OP.make_inputs(case, r, world, seed + 13 * r) for r in range(world)]
    xs = [i["x"].reshape(-1).float() for i in inputs]
    y = SCHEMES[scheme](xs, int(case.params["block"])).to(getattr(torch, case.dtype)).reshape(case.shape)
    return inputs, [{"y": y.clone()} for _ in range(world)]


def _case(shape, dtype, **params):
    return CaseSpec(name="t", shape=shape, dtype=dtype, params=params)


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("case", [_case([20000], "bfloat16", block=128), _case([96, 130], "float32", block=32, zero_frac=0.1),
                                  _case([10007], "bfloat16", block=100, spread=6.0), _case([300], "float32", block=1024),
                                  _case([3], "float32", block=16), _case([2, 500], "float32", block=16, zero_frac=1.0)])
def test_e4m3_rounded_twice_meets_the_bound(world, case):
    for scheme in ("two_stage", "one_shot"):
        inputs, outs = _run(case, world, scheme)
        assert OP.verify(case, world, inputs, outs, (0, 0)) is None, scheme


@pytest.mark.parametrize("scheme", ["per_tensor", "e5m2", "int8", "blocks_4x"])
def test_too_coarse_schemes_fail(scheme):
    case = _case([4, 25, 300], "bfloat16", block=64, spread=6.0)  # the card's wide-spread case
    inputs, outs = _run(case, 4, scheme)
    mm = OP.verify(case, 4, inputs, outs, (0, 0))
    assert mm is not None and mm["reason"] == "value", mm


def test_zeros_nans_and_disagreeing_ranks_fail():
    case = _case([1000], "float32", block=16, zero_frac=0.3)
    world = 2
    inputs, outs = _run(case, world, "two_stage")
    zero = (torch.stack([i["x"] for i in inputs]).abs().sum(0) == 0).nonzero()
    assert zero.numel() > 0
    bad = [{"y": o["y"].clone()} for o in outs]
    bad[1]["y"][int(zero[0])] = 1e-30  # not exactly zero where every rank is zero
    assert OP.verify(case, world, inputs, bad, (0, 0))["rank"] == 1
    bad = [{"y": o["y"].clone()} for o in outs]
    bad[0]["y"][7] = float("nan")
    assert OP.verify(case, world, inputs, bad, (0, 0))["reason"] == "nan"
    nz = int((torch.stack([i["x"] for i in inputs]).abs().sum(0) != 0).nonzero()[0])
    bad = [{"y": o["y"].clone()} for o in outs]
    bad[1]["y"][nz] = torch.nextafter(bad[1]["y"][nz], torch.tensor(float("inf")))  # one ulp: within the bound
    mm = OP.verify(case, world, inputs, bad, (0, 0))
    assert mm is not None and mm["reason"] == "semantics" and mm["rank"] == 1
    short = [{"y": o["y"][:-1]} for o in outs]
    assert OP.verify(case, world, inputs, short, (0, 0))["reason"] == "shape"


def test_card_cases_and_benchmark_mapping():
    card = load_task("collective/allreduce_fp8").card
    assert card.semantics.op == OP.name
    perf = card.performance
    case = OP.size_case(perf, 4 << 20, 4)
    assert case.dtype == "bfloat16" and case.shape == [2 << 20] and case.params["block"] == 128
    assert OP.metric_bytes(case, 4) == 4 << 20  # the logical bytes
    # benchmark inputs are plain N(0, 1): the card's tolerance passes a correct scheme and catches a lost rank
    small = case.model_copy(update={"shape": [200000]})
    inputs, outs = _run(small, 8, "two_stage")
    exact = sum(i["x"].double() for i in inputs)
    rtol, atol = card.tolerance_for("bfloat16").rtol, card.tolerance_for("bfloat16").atol
    assert torch.isclose(outs[0]["y"].double(), exact, rtol=rtol, atol=atol).all()
    lost = exact - inputs[3]["x"].double()
    assert (~torch.isclose(lost, exact, rtol=rtol, atol=atol)).double().mean() > 0.3
    picks = {}

    def pick(r, name, numel):
        picks[r] = torch.randint(0, numel, (50,), generator=torch.Generator().manual_seed(r))
        return picks[r]

    got = OP.expected_samples(small, 8, inputs, pick)
    assert all(torch.equal(got[r]["y"], exact.reshape(-1)[picks[r]]) for r in range(8))


def test_block_range_is_validated():
    with pytest.raises(ValueError, match="block"):
        OP.validate_case(_case([100], "float32", block=8))
    with pytest.raises(ValueError, match="dtype"):
        OP.validate_case(_case([100], "float16", block=16))
