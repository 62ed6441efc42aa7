"""Every cheating submission in tests/attacks/ must score zero, through the real judge and real rank processes."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest

from commbench_env.judge.host.result import Verdict
from commbench_env.score.reward import compute_reward

from .conftest import ATTACKS

TASK = "collective/allreduce_ring"

# Valid Python that the static check lets through: the judge's semantics must catch them.
SEMANTIC = {
    "fake_success_print": "wrong_answer",
    "visible_only": "wrong_answer",
    "return_input": "wrong_answer",
    "unwritten_buffer": "wrong_answer",
    "mutate_inputs": "wrong_answer",
    "local_only": "wrong_answer",
    "cache_outputs": "wrong_answer",
    "runtime_exit_early": "runtime_error",
}
ALL_FILES = sorted(p.stem for p in ATTACKS.glob("*.py"))
STATIC = [n for n in ALL_FILES if n not in SEMANTIC]


def test_attack_folder_is_complete():
    assert len(ALL_FILES) >= 20
    for name in ("patch_verification", "patch_timing", "fake_success_print", "exit_early", "cache_outputs",
                 "visible_only", "forbidden_alias", "runtime_forbidden_getattr", "runtime_file_channel",
                 "runtime_shared_memory", "sigterm_sleep", "return_input", "unwritten_buffer", "mutate_inputs",
                 "local_only"):
        assert name in ALL_FILES


@pytest.mark.parametrize("name", STATIC)
def test_static_check_flags(evaluate, name):
    res = evaluate(TASK, ATTACKS / f"{name}.py", mode="full")
    assert res.verdict == Verdict.forbidden, res.feedback()
    assert res.violations and res.violations[0].where == "static" and res.violations[0].line
    assert not res.ranks, "a statically rejected submission must never be run"
    assert compute_reward(res, None).reward == 0.0


@pytest.mark.parametrize("name", sorted(SEMANTIC))
def test_semantic_attacks_score_zero(evaluate, name):
    res = evaluate(TASK, ATTACKS / f"{name}.py", mode="full")
    assert res.verdict.value == SEMANTIC[name], res.feedback()
    assert compute_reward(res, None).reward == 0.0
    failed = [c for c in res.cases if not c.passed]
    bad_sizes = [s for s in res.benchmark if not s.verified]
    assert failed or bad_sizes
    if SEMANTIC[name] == "wrong_answer":
        m = failed[0].mismatch if failed else bad_sizes[0].mismatch
        assert m is not None and m.rank >= 0


def test_cache_attack_caught_in_timed_iterations(evaluate):
    res = evaluate(TASK, ATTACKS / "cache_outputs.py", mode="full")
    assert all(c.passed for c in res.cases), "one call per case: the cache is never hit in check mode"
    assert res.benchmark and not res.benchmark[0].verified
    assert "timed iteration" in res.benchmark[0].mismatch.detail


def test_mutated_inputs_are_named(evaluate):
    res = evaluate(TASK, ATTACKS / "mutate_inputs.py", mode="check")
    m = next(c.mismatch for c in res.cases if not c.passed)
    assert m.reason == "input_mutated" and m.output == "x"


def test_fake_print_is_only_feedback(evaluate):
    res = evaluate(TASK, ATTACKS / "fake_success_print.py", mode="check")
    assert res.verdict == Verdict.wrong_answer
    assert "COMMBENCH-RESULT" in res.ranks[0].stdout  # returned to the agent as its own output, never parsed


# --- the run-time layer on its own (static check switched off by the host, as only tests can) ------------------
RUNTIME_FORBIDDEN = ["runtime_numpy_file_channel", "runtime_forbidden_getattr", "runtime_forbidden_process_group", "runtime_file_channel",
                     "runtime_shared_memory", "runtime_socket_channel", "runtime_subprocess",
                     "runtime_introspect_harness", "runtime_tripwire_guard", "runtime_patch_harness",
                     "runtime_fabric_raw_collective"]


@pytest.mark.parametrize("name", RUNTIME_FORBIDDEN)
def test_runtime_guard_alone(evaluate, name):
    res = evaluate(TASK, ATTACKS / f"{name}.py", mode="check", static_check=False)
    assert res.verdict == Verdict.forbidden, res.feedback()
    assert any(v.where == "runtime" for v in res.violations)
    assert compute_reward(res, None).reward == 0.0


def test_a_collective_written_on_the_channel_is_refused_by_the_coordinator(evaluate):
    res = evaluate(TASK, ATTACKS / "runtime_fabric_raw_collective.py", mode="check", static_check=False)
    assert res.verdict == Verdict.forbidden, res.feedback()
    assert "called torch.distributed all_reduce, which this task forbids" in res.summary


def test_data_outside_messages_reaches_no_rank(evaluate):
    res = evaluate(TASK, ATTACKS / "runtime_fabric_smuggle.py", mode="check", static_check=False)
    assert res.verdict == Verdict.runtime_error, res.feedback()
    # refused at its first invented frame: a group name long enough to carry data, or the made-up operation
    assert "malformed name" in res.summary or "unknown fabric operation 'peek'" in res.summary
    assert compute_reward(res, None).reward == 0.0


def test_runtime_verification_patch_has_no_effect(evaluate):
    """Verification runs in the coordinator, so the patch changes nothing there; in the rank it is undone and named."""
    res = evaluate(TASK, ATTACKS / "runtime_patch_verification.py", mode="check", static_check=False)
    assert res.verdict == Verdict.forbidden
    assert any("commbench_env.golden.compare.compare_tensor" in v.detail and "put it back" in v.detail
               for v in res.violations), res.violations
    assert any(not c.passed for c in res.cases), "the zeros it returns are still judged wrong"


def test_frames_below_the_candidate_hold_no_harness_state(evaluate):
    """The submission raises if any frame it can reach holds the harness's channel, seeds, inputs or marks."""
    res = evaluate(TASK, ATTACKS / "runtime_frame_walk.py", mode="full", static_check=False)
    assert res.verdict == Verdict.passed, res.feedback()


def test_releasing_the_judges_lock_early_does_not_stop_the_clock(evaluate):
    res = evaluate(TASK, ATTACKS / "runtime_release_early.py", mode="benchmark", static_check=False)
    assert res.verdict == Verdict.passed, res.feedback()
    assert res.benchmark and all(b.time_us_min >= 45_000 for b in res.benchmark), \
        [b.time_us_min for b in res.benchmark]


def test_harness_patch_is_undone_before_anything_is_sent(evaluate):
    res = evaluate(TASK, ATTACKS / "runtime_patch_harness.py", mode="benchmark", static_check=False)
    assert any("commbench_env.judge.protocol.Channel.send" in v.detail for v in res.violations), res.violations
    assert res.benchmark and all(b.time_us > 1.0 for b in res.benchmark), "a forged 1 ns timing got through"


def test_finalizers_never_run_on_the_harness_thread(evaluate):
    res = evaluate(TASK, ATTACKS / "runtime_finalizer_escape.py", mode="full", static_check=False)
    assert res.verdict == Verdict.passed, res.feedback()
    out = "".join(r.stdout for r in res.ranks)
    for tag in ("weakref-input", "weakref-output", "__del__-output", "cycle"):
        assert f"finalizer {tag} ran on the candidate thread" in out, out[-2000:]
    assert "HARNESS THREAD" not in out, out[-2000:]


def test_class_patches_are_undone_and_named(evaluate):
    res = evaluate(TASK, ATTACKS / "runtime_patch_class.py", mode="full", static_check=False)
    details = " ".join(v.detail for v in res.violations)
    assert "torch.Tensor.clone (added)" in details, details
    assert "commbench_env.golden.base.GoldenOp.call" in details, details
    assert res.verdict == Verdict.forbidden
    assert all(c.passed for c in res.cases), "the harness kept working: every call went through the real op"


def test_a_thread_left_running_stops_the_rank(evaluate):
    res = evaluate(TASK, ATTACKS / "runtime_left_thread.py", mode="check", static_check=False)
    assert res.verdict == Verdict.runtime_error, res.feedback()
    assert "left a thread running" in res.feedback()
    assert compute_reward(res, None).reward == 0.0


def test_exit_early_is_not_success(evaluate):
    res = evaluate(TASK, ATTACKS / "runtime_exit_early.py", mode="check")
    assert res.verdict == Verdict.runtime_error
    assert "SystemExit" in res.summary


def test_runtime_clock_patch_does_not_change_timing(evaluate):
    source = (ATTACKS / "runtime_patch_timing.py").read_text()
    honest_source = "\n".join(ln for ln in source.splitlines() if not ln.startswith("time."))
    cheat = evaluate(TASK, source, mode="benchmark", static_check=False)
    honest = evaluate(TASK, honest_source, mode="benchmark", static_check=False)
    assert honest.verdict == Verdict.passed, honest.feedback()
    assert cheat.verdict == Verdict.forbidden  # the patch is undone and named
    assert any("time.perf_counter_ns" in v.detail for v in cheat.violations), cheat.violations
    assert cheat.benchmark, "the judge still measured it"
    for c, h in zip(cheat.benchmark, honest.benchmark):
        assert c.time_us > 1.0, "the harness clock must not be the patched one"
        assert 0.1 < c.time_us / h.time_us < 10


def test_sigterm_ignoring_sleep_is_killed_at_the_limit(evaluate):
    t0 = time.monotonic()
    res = evaluate(TASK, ATTACKS / "runtime_sigterm_sleep.py", mode="check", static_check=False, timeout_s=3)
    elapsed = time.monotonic() - t0
    assert res.verdict == Verdict.timeout
    assert "did not finish" in res.summary and "0" in res.summary and "1" in res.summary
    assert elapsed < 3 + 8
    assert all(r.state == "hung" for r in res.ranks)
    assert any("sleep" in (r.stack or "") or "all_reduce" in (r.stack or "") for r in res.ranks)


def test_secret_seed_is_unreachable(evaluate):
    secret = secrets.token_bytes(32)
    res = evaluate(TASK, ATTACKS / "runtime_read_secrets.py", mode="check", static_check=False, secret=secret)
    out = "".join(r.stdout + r.stderr for r in res.ranks)
    assert "parent" in out  # the attack ran and printed what it could see
    assert secret.hex() not in out
    assert "refused" in out  # the coordinator's /proc entries are closed to the candidate
    assert res.verdict == Verdict.forbidden  # and the attempt is recorded


def test_ranks_cannot_read_the_repository(evaluate):
    """The reference solution lies in the repository on a local host; ranks must not be able to read it."""
    ref = Path(__file__).resolve().parent.parent / "tasks" / "collective" / "allreduce_ring" / "reference.py"
    source = f"""
import torch
TEXT = open({str(ref)!r}).read()


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    return x.clone()
"""
    res = evaluate(TASK, source, mode="check", static_check=False)
    if not res.isolation.get("landlock_abi"):
        pytest.skip("this kernel has no Landlock; the docker backend isolates files there")
    assert res.verdict == Verdict.forbidden
    assert "denied" in res.summary or "denied" in res.feedback()
