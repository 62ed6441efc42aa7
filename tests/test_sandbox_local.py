"""The local backend: fresh folders, time limits that kill whole groups, limits, output caps, clean-up."""

from __future__ import annotations

import os
import sys
import time

import pytest

from commbench_env.errors import SandboxError
from commbench_env.sandbox import load_profile, open_sandbox


@pytest.fixture()
def sb():
    s = open_sandbox("local-cpu")
    s.start()
    yield s
    s.close()


def test_exec_and_files(sb):
    sb.write_files({"a/b.txt": "hello", "c.bin": b"\x00\x01"})
    assert sb.read_file("a/b.txt") == b"hello"
    res = sb.exec(["cat", "a/b.txt"], timeout=10)
    assert res.returncode == 0 and res.stdout == "hello" and not res.timed_out
    res = sb.exec([sys.executable, "-c", "import sys; sys.stdin.read() == 'x' or sys.exit(3)"], timeout=10, input=b"x")
    assert res.returncode == 0


def test_host_environment_does_not_leak(sb, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-for-test")
    res = sb.exec([sys.executable, "-c", "import os; print(sorted(os.environ))"], timeout=10)
    assert "OPENAI_API_KEY" not in res.stdout and "sk-secret" not in res.stdout
    assert "GLOO_SOCKET_IFNAME" in res.stdout


def test_a_profile_with_extra_env_reaches_the_sandbox_and_leaves_the_original_alone():
    base = load_profile("local-cpu")
    traced = base.with_env({"COMMBENCH_TIMING_TRACE": "/tmp/trace.jsonl"})
    assert "COMMBENCH_TIMING_TRACE" not in base.env
    with open_sandbox(traced) as s:
        s.start()
        res = s.exec([sys.executable, "-c", "import os; print(os.environ.get('COMMBENCH_TIMING_TRACE'))"], timeout=10)
    assert res.stdout.strip() == "/tmp/trace.jsonl"


def test_paths_cannot_leave_the_workdir(sb):
    with pytest.raises(SandboxError):
        sb.write_files({"../escape.txt": "x"})
    with pytest.raises(SandboxError):
        sb.read_file("/etc/passwd")


def test_timeout_kills_the_whole_group_even_ignoring_sigterm(sb):
    script = (
        "import os, signal, time, subprocess, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        "open('child.pid', 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    sb.write_files({"hang.py": script})
    t0 = time.monotonic()
    res = sb.exec([sys.executable, "hang.py"], timeout=2)
    assert res.timed_out and time.monotonic() - t0 < 6
    pid = int(sb.read_file("child.pid"))
    time.sleep(0.2)
    assert not _running(pid), "the SIGTERM-ignoring grandchild must be gone"


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed process whose parent died waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_output_is_capped(sb):
    res = sb.exec([sys.executable, "-c", "print('x' * 5_000_000)"], timeout=20)
    assert res.truncated and len(res.stdout) < 1_200_000 and "bytes cut" in res.stdout


def test_cpu_limit_applies(tmp_path):
    prof = load_profile("local-cpu").model_copy(deep=True)
    prof.limits.cpu_time_s = 1
    s = open_sandbox(prof)
    s.start()
    try:
        res = s.exec([sys.executable, "-c", "while True: pass"], timeout=30)
        assert not res.timed_out and res.returncode != 0  # SIGXCPU after one CPU second
    finally:
        s.close()


def test_close_removes_everything_and_is_idempotent():
    s = open_sandbox("local-cpu")
    s.start()
    wd = s.workdir
    assert os.path.isdir(wd)
    s.close()
    s.close()
    assert not os.path.exists(wd) and not s.alive
    with pytest.raises(SandboxError):
        _ = s.workdir


def test_hardware_description(sb):
    hw = sb.hardware()
    assert hw.backend == "local" and hw.cpu_count >= 1 and hw.torch
    assert len(hw.fingerprint) == 16
