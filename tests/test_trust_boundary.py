"""Attacks on the judge's trust boundary (tests/attacks/kernel/), through the real judge with the static check off:
each must score zero, or fail at what it tried, because of a layer outside the candidate's process (the spawner,
the coordinator's checks and clock, the framed channel, Landlock, seccomp), not because of a Python-level guard.
See docs/trust-model.md."""

from __future__ import annotations

import subprocess
import time

import pytest

from commbench_env.judge.host.result import Verdict
from commbench_env.score.reward import compute_reward

from .conftest import ATTACKS

TASK = "collective/allreduce_ring"
KERNEL = ATTACKS / "kernel"


def _stdout(res) -> str:
    return "\n".join(r.stdout for r in res.ranks)


def _run(evaluate, name: str, mode: str = "check"):
    return evaluate(TASK, KERNEL / f"{name}.py", mode=mode, static_check=False)


def test_no_secret_or_hidden_case_in_a_rank_s_memory(evaluate):
    res = _run(evaluate, "secret_scan")
    assert "LEAKED" not in _stdout(res), _stdout(res)
    assert res.verdict == Verdict.wrong_answer, res.feedback()
    assert compute_reward(res, None).reward == 0.0


def test_a_rank_cannot_read_its_peers_folder(evaluate):
    res = _run(evaluate, "stdout_channel")
    out = _stdout(res)
    assert "READ-PEER" not in out and "DENIED" in out, out
    assert compute_reward(res, None).reward == 0.0


def test_a_rank_cannot_read_other_processes_proc_entries(evaluate):
    res = _run(evaluate, "proc_peek")
    out = _stdout(res)
    assert "PROC-LEAK" not in out and out.count("DENIED") >= 4, out


def test_a_detached_process_is_never_started(evaluate):
    res = _run(evaluate, "detached_child")
    out = _stdout(res)
    assert "NOT-SPAWNED" in out and "SPAWNED\n" not in out, out
    assert res.isolation.get("seccomp") is True
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", "commbench-detached-marker"], capture_output=True, text=True)
    assert not left.stdout.strip(), left.stdout


@pytest.mark.parametrize("name", ["unbound_backend", "functional_collective"])
def test_forbidden_collectives_are_refused_where_they_run(evaluate, name):
    """On CPUs these routes lead nowhere: a rank's process group is the coordinator's fabric, with no backend object
    and no libtorch collective behind it, so the call fails in the rank (the fabric itself refuses a forbidden
    collective however it is written: test_attacks' runtime_fabric_raw_collective)."""
    res = _run(evaluate, name)
    assert res.verdict in (Verdict.forbidden, Verdict.runtime_error), res.feedback()
    assert not any(c.passed for c in res.cases)
    assert compute_reward(res, None).reward == 0.0


@pytest.mark.parametrize("name", ["garbage_frame", "complex_output"])
def test_a_broken_channel_or_output_is_the_rank_s_failure_not_the_judge_s(evaluate, name):
    res = _run(evaluate, name)
    assert res.verdict == Verdict.runtime_error, res.feedback()
    assert "protocol" in res.summary
    assert compute_reward(res, None).reward == 0.0


def test_inputs_changed_in_timed_calls_fail_the_benchmark(evaluate):
    res = _run(evaluate, "mutate_timed_inputs", mode="full")
    assert all(c.passed for c in res.cases), res.feedback()
    bad = [s for s in res.benchmark if not s.verified]
    assert bad and bad[0].mismatch.reason == "input_mutated", res.feedback()
    assert res.verdict == Verdict.wrong_answer
    assert compute_reward(res, None).reward == 0.0


def test_isolation_is_reported_from_before_candidate_code(evaluate):
    res = evaluate(TASK, mode="check")
    iso = res.isolation
    assert iso["seccomp"] is True and iso["landlock_abi"] >= 1 and iso["proc_hidden"] is True, iso
    assert iso["new_sockets"] is False and iso["dispatch_guard"] is True


def test_the_judge_server_serves_only_its_host(judge, evaluate):
    """A process of the same user that lacks the host's token is refused, and cannot stop the server either."""
    import socket

    from commbench_env.judge.protocol import recv_msg, send_msg

    path = judge._ensure_server()
    for cmd in ("run", "stop"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        send_msg(s, {"cmd": cmd, "token": "not-the-token"}, b'{"mode": "check"}')
        header, _ = recv_msg(s)
        s.close()
        assert header["ok"] is False and "token" in header["error"]
    assert evaluate(TASK, mode="check").verdict == Verdict.passed  # still serving


def test_a_package_left_in_the_sandbox_is_never_imported_by_the_judge():
    """Judge entry points run isolated (python -I): a `torch.py` or `commbench_env/` planted in the sandbox's start
    folder is not imported by the next evaluation, cold or warm."""
    from commbench_env.cards import load_task
    from commbench_env.judge.host.client import JudgeClient
    from commbench_env.sandbox import load_profile, open_sandbox

    task = load_task(TASK)
    for warm in (False, True):
        with open_sandbox(load_profile("local-cpu").model_copy(update={"warm_server": warm})) as sb:
            sb.write_files({"torch.py": "raise SystemExit('planted torch imported')\n",
                            "commbench_env/__init__.py": "raise SystemExit('planted package imported')\n"})
            client = JudgeClient(sb)
            try:
                res = client.evaluate(task, {task.card.entry.file: task.reference_source()}, "check", 2)
            finally:
                client.close()
            assert res.verdict == Verdict.passed, res.feedback()
