"""The judge end to end: verdicts, pinpointed mismatches, hangs, crashes, benchmark figures, profile, isolation."""

from __future__ import annotations

import threading
import time

import pytest

from commbench_env.cards import busbw_factor, load_task
from commbench_env.judge.host.result import Verdict

TASK = "collective/allreduce_ring"

WRONG_CHUNK = '''
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    for step in range(1, world):
        dst, src = (rank + step) % world, (rank - step) % world
        buf = torch.empty_like(x)
        reqs = [dist.isend(x, dst), dist.irecv(buf, src)]
        for r in reqs:
            r.wait()
        out += buf
    if rank == 1 and out.numel() > 7:
        out.view(-1)[7] += 1   # one wrong element on one rank
    return out
'''

HANG_ON_RANK_1 = '''
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if dist.get_rank() == 1:
        while True:
            pass
    return x * 2
'''

CRASH_RANK_0 = '''
import faulthandler
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if dist.get_rank() == 0:
        faulthandler._sigsegv()
    return x * 2
'''

NAIVE_CORRECT = '''
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Everyone sends its whole tensor to everyone: correct, simple, (n-1)x the ring's traffic."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    for step in range(1, world):
        dst, src = (rank + step) % world, (rank - step) % world
        buf = torch.empty_like(x)
        reqs = [dist.isend(x, dst), dist.irecv(buf, src)]
        for r in reqs:
            r.wait()
        out += buf
    return out
'''


@pytest.mark.parametrize("world", [2, 4])
def test_reference_full_mode_figures(evaluate, world):
    res = evaluate(TASK, mode="full", world=world)
    assert res.verdict == Verdict.passed, res.feedback()
    assert res.correct and len(res.cases) == 6 and sum(not c.visible for c in res.cases) == 4
    assert [s.size_bytes for s in res.benchmark] == [65536, 1048576, 8388608]
    for s in res.benchmark:
        assert s.verified and s.iters == 5 and len(s.per_rank_mean_us) == world
        assert s.time_us == pytest.approx(max(s.per_rank_mean_us))  # nccl-tests: max over ranks
        assert s.algbw_gbps == pytest.approx(s.size_bytes / (s.time_us * 1e-6) / 1e9)
        assert s.busbw_gbps == pytest.approx(s.algbw_gbps * 2 * (world - 1) / world)
        assert s.time_us_min <= s.time_us_median
    assert res.timings.total_s > 0 and res.timings.rendezvous_s > 0
    assert len(res.ranks) == world and all(r.state == "ok" for r in res.ranks)


def test_busbw_factors_follow_nccl_tests():
    assert busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert busbw_factor("all_gather", 4) == pytest.approx(0.75)
    assert busbw_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert busbw_factor("alltoall", 2) == pytest.approx(0.5)
    assert busbw_factor("broadcast", 4) == busbw_factor("sendrecv", 4) == 1.0


def test_wrong_solution_pinpointed(evaluate):
    res = evaluate(TASK, WRONG_CHUNK, mode="check", world=4)
    assert res.verdict == Verdict.wrong_answer
    m = res.cases[0].mismatch
    assert m.case == "small-f32" and m.rank == 1 and m.index == [7] and m.output == "y"
    assert m.reason == "value" and float(m.got) == pytest.approx(float(m.expected) + 1.0, abs=1e-4)
    assert m.wrong_count == 1 and m.total_count == 1024
    text = res.feedback()
    assert "rank 1" in text and "index [7]" in text


def test_hidden_case_shapes_never_reach_feedback(evaluate):
    res = evaluate(TASK, WRONG_CHUNK, mode="check", world=2)
    text = res.feedback()
    assert "hidden #1" in text, text  # failed once in a full run (2026-11-30), not reproduced: keep the text
    for case in ("odd-length", "shorter-than-world", "int-3d", "4099"):
        assert case not in text


def test_naive_correct_passes_but_is_slower(evaluate):
    naive = evaluate(TASK, NAIVE_CORRECT, mode="full", world=4)
    assert naive.verdict == Verdict.passed


def test_hang_names_the_ranks_and_stack(evaluate):
    t0 = time.monotonic()
    res = evaluate(TASK, HANG_ON_RANK_1, mode="check", world=2, timeout_s=3)
    assert time.monotonic() - t0 < 3 + 8
    assert res.verdict == Verdict.timeout
    assert "rank(s) 1 did not finish" in res.summary
    hung = {r.rank: r for r in res.ranks}
    assert hung[1].state == "hung" and "all_reduce" in (hung[1].stack or "")
    assert hung[0].state != "hung"


def test_crashing_rank_fails_cleanly(evaluate):
    res = evaluate(TASK, CRASH_RANK_0, mode="check", world=2, static_check=False)
    assert res.verdict == Verdict.runtime_error
    assert "rank 0" in res.summary and "SIGSEGV" in res.summary
    assert res.ranks[0].state == "crashed" and res.ranks[0].signal == 11


def test_missing_function_is_a_compile_error(evaluate):
    res = evaluate(TASK, "import torch\n\ndef something_else(x):\n    return x\n", mode="check")
    assert res.verdict == Verdict.compile_error
    assert "missing required function" in res.compile.log and not res.ranks


def test_syntax_error_reports_line(evaluate):
    res = evaluate(TASK, "import torch\n\ndef all_reduce(x):\n    return x +\n", mode="compile")
    assert res.verdict == Verdict.compile_error
    assert 'line 4' in res.compile.log and "SyntaxError" in res.compile.log


def test_compile_mode_runs_nothing(evaluate):
    res = evaluate(TASK, mode="compile")
    assert res.verdict == Verdict.compiled and not res.ranks and not res.cases


def test_profile_reports_comm_and_compute(evaluate):
    res = evaluate(TASK, mode="profile", world=2)
    assert res.verdict == Verdict.passed, res.feedback()
    assert len(res.profile) == 2
    for p in res.profile:
        names = {r.name for r in p.rows if r.kind == "comm"}
        assert {"dist.isend", "dist.irecv"} <= names
        assert p.wall_us > 0 and p.comm_us > 0 and p.comm_us <= p.wall_us * 1.05
        assert any(r.kind == "compute" for r in p.rows)
    assert "profile" in res.feedback()


def test_concurrent_evaluations_do_not_collide(evaluate):
    """Two evaluations on one host at once: ports are chosen by the OS per evaluation, folders are fresh."""
    results = []

    def run():
        results.append(evaluate(TASK, mode="check", world=4))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and all(r.verdict == Verdict.passed for r in results)


def test_each_evaluation_uses_fresh_processes(evaluate):
    """A global counter in the candidate starts from zero every evaluation: no state survives."""
    src = '''
import torch
import torch.distributed as dist
CALLS = [0]


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    CALLS[0] += 1
    print("calls", CALLS[0])
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    for step in range(1, world):
        dst, src = (rank + step) % world, (rank - step) % world
        buf = torch.empty_like(x)
        reqs = [dist.isend(x, dst), dist.irecv(buf, src)]
        for r in reqs:
            r.wait()
        out += buf
    return out
'''
    for _ in range(2):
        res = evaluate(TASK, src, mode="check", world=2)
        assert res.ranks[0].stdout.splitlines()[0] == "calls 1"


def test_candidate_output_is_truncated(evaluate):
    src = "import torch\nprint('x' * 100000)\n\ndef all_reduce(x):\n    return x.clone()\n"
    res = evaluate(TASK, src, mode="check", world=2)
    assert len(res.ranks[0].stdout) < 5000 and "bytes cut" in res.ranks[0].stdout


def test_isolation_layers_reported(evaluate):
    res = evaluate(TASK, mode="check", world=2)
    iso = res.isolation
    assert iso["audit_hook"] and iso["tripwires"] and iso["non_dumpable"]
    assert "landlock_abi" in iso


def test_sanitize_on_a_torch_task_is_refused_before_any_run(judge):
    """A request the task cannot serve is the caller's mistake: a CardError naming the tools to use, never an
    infra_error verdict (a pool would restart a healthy sandbox for it)."""
    from commbench_env.errors import CardError, SandboxError

    task = load_task("p2p/ring_shift")
    with pytest.raises(CardError, match="CUDA tasks only") as err:
        judge.evaluate(task, {task.card.entry.file: task.reference_source()}, "sanitize", 2)
    assert not isinstance(err.value, SandboxError)
    assert judge.evaluate(task, {task.card.entry.file: task.reference_source()}, "check", 2).verdict.value == "pass"
