"""Expert-parallel verification: moe_dispatch_combine's experts are bound to the exact rows they are handed.

The harness's `expert_fn` adds to its secret affine transform a keyed hash of each row's exact bits, so the
coordinator's check of y[i] (recomputed from tokens[i] and the owner's keys) proves that token i reached its
expert's rank unmodified and that the expert's output came back. Probing the experts (made-up rows, the rank's
own tokens, right row counts) or fitting them from the rows they did process reveals nothing about other rows:
the cheats in tests/attacks/ep/ all score zero, in the checked cases and in the sampled checks of timed calls."""

from __future__ import annotations

import re
import sys

import pytest
import torch

from commbench_env.cards import CaseSpec, load_task
from commbench_env.golden import get_op
from commbench_env.golden.compare import first_mismatch
from commbench_env.judge.protocol import sample_positions
from commbench_env.judge.host.result import Verdict
from commbench_env.score.reward import compute_reward

from .conftest import ATTACKS

TASK = "ep/moe_dispatch_combine"
OP = get_op("moe_dispatch_combine")
# the op's module, reached through the registry: importing a golden module by name before the registry has
# loaded would leave it holding that module's ops only
moe = sys.modules[type(OP).__module__]
EP_ATTACKS = sorted((ATTACKS / "ep").glob("*.py"))
TOL = {"float32": (1e-4, 1e-5), "float64": (1e-9, 1e-9), "bfloat16": (2e-2, 2e-2)}


def _header(path, key: str) -> str:
    m = re.search(rf"^# {key}: *(\S+)", path.read_text(), re.M)
    assert m, f"{path.name} has no '# {key}:' line"
    return m.group(1)


def _case(shape=(40, 6), dtype="float32", **params) -> CaseSpec:
    params.setdefault("experts_per_rank", 3)
    return CaseSpec(name="t", shape=list(shape), dtype=dtype, params=params)


def _inputs(case, world: int, seed: int = 11) -> list[dict]:
    return [OP.make_inputs(case, r, world, seed * 7919 + r) for r in range(world)]


def _simulate(case, world: int, inputs: list[dict], *, chunk: int = 3) -> list[dict]:
    """An honest run without processes: each rank's call (through the harness's own expert_fn) processes every
    token routed to its experts, in reversed chunks of `chunk` rows; the results go back to their sources."""
    epr = int(case.params["experts_per_rank"])
    done = [torch.empty_like(i["tokens"]) for i in inputs]
    outputs = []
    for r in range(world):
        def forward(tokens, expert_ids, expert_fn, experts_per_rank, r=r):
            for s, inp in enumerate(inputs):
                for j in range(experts_per_rank):
                    rows = (inp["expert_ids"] == r * epr + j).nonzero().flatten().flip(0)
                    for a in range(0, rows.numel(), chunk):
                        sel = rows[a:a + chunk]
                        done[s][sel] = expert_fn(j, inp["tokens"][sel])
            return torch.empty_like(tokens)
        outputs.append(OP.call({"moe_forward": forward}, inputs[r], case, r, world))
    for r in range(world):
        outputs[r]["y"] = done[r]
    return outputs


def _samples(case, world: int, inputs: list[dict], seed: int):
    """(sampled expectation, the same positions indexed in the full expectation), as the coordinator draws them."""
    gens = [torch.Generator().manual_seed(seed) for _ in range(world)]
    drawn: list[dict] = [{} for _ in range(world)]

    def pick(rank, name, numel):
        drawn[rank][name] = sample_positions(numel, gens[rank])
        return drawn[rank][name]

    fast = OP.expected_samples(case, world, inputs, pick)
    full = OP.expected(case, world, inputs)
    slow = [{n: full[r][n].reshape(-1)[drawn[r][n]] for n in sorted(full[r])} for r in range(world)]
    return fast, slow


# ---- golden semantics ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", sorted(TOL))
@pytest.mark.parametrize("world", [2, 3, 4])
def test_honest_processing_in_any_chunks_and_order_passes(dtype, world):
    case = _case(dtype=dtype, empty_rank=1)
    inputs = _inputs(case, world)
    assert first_mismatch(case, OP.expected(case, world, inputs), _simulate(case, world, inputs), TOL[dtype]) is None
    assert first_mismatch(case, OP.expected(case, world, inputs), _simulate(case, world, inputs, chunk=1000),
                          TOL[dtype]) is None


def test_the_keys_stay_in_the_harness_and_come_from_the_call_seed():
    case = _case()
    a, b = OP.make_inputs(case, 0, 2, 5), OP.make_inputs(case, 0, 2, 6)
    secret = {k for k in a if k.startswith("secret_")}
    assert {"secret_row_mult", "secret_row_mix", "secret_noise_keys"} <= secret
    assert not secret & set(OP.candidate_inputs(a))
    assert not torch.equal(a["secret_noise_keys"], b["secret_noise_keys"])  # a fresh transform per call
    assert torch.equal(a["secret_noise_keys"], OP.make_inputs(case, 0, 2, 5)["secret_noise_keys"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_an_expert_output_depends_on_every_bit_of_its_row(dtype):
    case = _case((64, 48), dtype, experts_per_rank=1)
    inp = OP.make_inputs(case, 0, 2, 3)
    fn = _expert_fn(inp, case)
    x = inp["tokens"][:8].clone()
    y = fn(0, x)
    for feature in (0, 17, 47):
        x2 = x.clone()
        bits = x2.view(moe._bits_dtype(x2.dtype))
        bits[:, feature] ^= 1  # the lowest bit of one feature
        y2 = fn(0, x2)
        changed = (y2 - y).abs() > 1e-3  # the affine part moves by one ulp: anything larger is the row's noise
        assert changed.float().mean() > 0.9, (feature, changed.float().mean())


def _expert_fn(inp, case):
    got = {}

    def forward(tokens, expert_ids, expert_fn, experts_per_rank):
        got["fn"] = expert_fn
        return tokens.clone()
    OP.call({"moe_forward": forward}, inp, case, 0, 2)
    return got["fn"]


def test_probes_and_fits_do_not_predict_other_rows():
    """What the attacks do, in one process: the best affine model of an expert, from probe rows or from a
    least-squares fit over many rows, misses the expert's outputs for new rows by O(1)."""
    case = _case((400, 32), experts_per_rank=1)
    inp = OP.make_inputs(case, 0, 2, 9)
    fn = _expert_fn(inp, case)
    x = inp["tokens"]
    probe = torch.zeros((2, 32))
    probe[1] = 1
    p = fn(0, probe).double()
    probed = x.double() * (p[1] - p[0]) + p[0]
    fit_x, fit_y = x[:300].double(), fn(0, x[:300]).double()
    xc, yc = fit_x - fit_x.mean(0), fit_y - fit_y.mean(0)
    scale = (xc * yc).sum(0) / (xc * xc).sum(0)
    fitted = x.double() * scale + (fit_y.mean(0) - scale * fit_x.mean(0))
    truth = fn(0, x).double()
    for guess in (probed, fitted[300:]):
        err = (guess - truth[-guess.shape[0]:]).abs()
        assert err.median() > 0.1 and (err > 1e-3).float().mean() > 0.95


def test_int32_noise_is_the_wrapped_arithmetic_the_coordinator_assumes():
    """The noise of float32 rows is int32 arithmetic that wraps; checked here against int64 arithmetic reduced
    mod 2**32, so a platform where torch's int32 products saturate or trap would show."""
    g = torch.Generator().manual_seed(4)
    h = moe._random_keys((500,), torch.int64, g, odd=False)
    ka, kb = (moe._random_keys((500,), torch.int32, g, odd=True) for _ in range(2))

    def wrap(v):
        return ((v + (1 << 31)) & 0xFFFF_FFFF) - (1 << 31)
    z = wrap((h >> 32) * ka.long())
    z = z ^ (z >> 16)
    z = wrap(z * kb.long())
    assert torch.equal(moe._noise(h, ka, kb, torch.float32).long(), z >> 8)
    if torch.cuda.is_available():
        on_gpu = moe._noise(h.cuda(), ka.cuda(), kb.cuda(), torch.float32).cpu()
        assert torch.equal(on_gpu, moe._noise(h, ka, kb, torch.float32))


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sampled_check_covers_both_outputs_and_matches_the_full_check(world, dtype):
    for case in (_case((97, 24), dtype, skew=1.5, idle_rank=1), _case((33, 7), dtype, empty_rank=0),
                 OP.size_case(load_task(TASK).card.performance, 65536, world)):
        inputs = _inputs(case, world, seed=world)
        fast, slow = _samples(case, world, inputs, seed=123)
        for r in range(world):
            assert set(fast[r]) == set(slow[r]) == {"y", "expert_rows"}
            for name in fast[r]:
                torch.testing.assert_close(fast[r][name], slow[r][name], rtol=0, atol=0)


def test_a_wrong_expert_is_caught_by_the_sampled_check():
    """The sampled check sees a rank whose tokens were processed by the wrong owner's keys (a transform applied
    to rows that never came from the dispatch)."""
    world = 2
    case = OP.size_case(load_task(TASK).card.performance, 65536, world)
    inputs = _inputs(case, world, seed=7)
    fast, _ = _samples(case, world, inputs, seed=99)
    swapped = [dict(i) for i in inputs]
    for k in ("secret_row_mult", "secret_row_mix", "secret_noise_keys"):
        swapped[0][k], swapped[1][k] = inputs[1][k], inputs[0][k]
    wrong, _ = _samples(case, world, swapped, seed=99)
    for r in range(world):
        assert not torch.allclose(fast[r]["y"], wrong[r]["y"], rtol=1e-4, atol=1e-5)


# ---- through the real judge --------------------------------------------------------------------------------------

def _judged(path):
    """An attack file as a test parameter; `EXPECT: open` (a gap not closed yet) is a strict expected failure."""
    if _header(path, "EXPECT") == "open":
        return pytest.param(path, id=path.stem, marks=pytest.mark.xfail(
            strict=True, reason="open gap, see the file's header: it still passes the judge"))
    return pytest.param(path, id=path.stem)


def test_attack_files_name_their_task_and_verdict():
    closed = [p for p in EP_ATTACKS if _header(p, "EXPECT") != "open"]
    assert len(closed) >= 3
    for path in EP_ATTACKS:
        assert _header(path, "TASK") == TASK, path.name
        assert _header(path, "EXPECT") in ("wrong_answer", "forbidden", "open"), path.name


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("path", [_judged(p) for p in EP_ATTACKS])
def test_transform_probing_attacks_score_zero(evaluate, path, world):
    res = evaluate(_header(path, "TASK"), path, mode="full", world=world)
    expect = _header(path, "EXPECT")
    assert res.verdict.value == ("forbidden" if expect == "open" else expect), res.feedback()
    assert compute_reward(res, None).reward == 0.0
    if res.verdict == Verdict.wrong_answer:  # caught by the outputs: the expert outputs, not the row counts
        failed = [c for c in res.cases if not c.passed]
        bad = [s for s in res.benchmark if not s.verified]
        m = failed[0].mismatch if failed else bad[0].mismatch
        assert m is not None and m.output == "y" and 0 <= m.rank < world, m


def test_a_cheat_only_in_timed_calls_is_caught_by_the_sampled_check(evaluate):
    res = evaluate(TASK, ATTACKS / "ep" / "ep_probe_in_timed_calls.py", mode="full", world=2)
    assert all(c.passed for c in res.cases), res.feedback()
    assert res.verdict == Verdict.wrong_answer
    assert res.benchmark and all(not s.verified for s in res.benchmark)
    assert all("sampled check" in s.mismatch.detail for s in res.benchmark)


@pytest.mark.parametrize("world", [2, 4])
def test_the_reference_passes_checks_and_timed_calls(evaluate, world):
    res = evaluate(TASK, mode="full", world=world)
    assert res.verdict == Verdict.passed, res.feedback()
    assert res.cases and all(c.passed for c in res.cases)
    assert res.benchmark and all(s.verified for s in res.benchmark)
