"""One conformance suite for every sandbox backend: exec, files, time limits, output caps, clean-up."""

from __future__ import annotations

import time

import pytest

from commbench_env.errors import SandboxError
from commbench_env.sandbox import open_sandbox

from .sandbox_support import require_docker

BACKENDS = [pytest.param("local-cpu", id="local"), pytest.param("docker-cpu", id="docker", marks=pytest.mark.docker)]


@pytest.fixture(params=BACKENDS)
def sb(request):
    if request.param.startswith("docker"):
        require_docker()
    s = open_sandbox(request.param)
    s.start()
    yield s
    s.close()


def test_exec_output_and_exit_code(sb):
    res = sb.exec([sb.python, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"], timeout=30)
    assert res.returncode == 3 and res.stdout.strip() == "out" and res.stderr.strip() == "err" and not res.timed_out


def test_exec_stdin(sb):
    res = sb.exec([sb.python, "-c", "import sys; print(sys.stdin.read()[::-1])"], timeout=30, input=b"abc")
    assert res.stdout.strip() == "cba"


def test_files_round_trip(sb):
    sb.write_files({"dir/sub/a.txt": "hello", "bin.dat": bytes(range(256))})
    assert sb.read_file("dir/sub/a.txt") == b"hello"
    assert sb.read_file("bin.dat") == bytes(range(256))
    res = sb.exec(["cat", "dir/sub/a.txt"], timeout=30)
    assert res.stdout == "hello"
    res = sb.exec(["cat", "a.txt"], timeout=30, cwd="dir/sub")
    assert res.stdout == "hello"


def test_paths_stay_inside(sb):
    with pytest.raises(SandboxError):
        sb.write_files({"../../escape.txt": "x"})
    with pytest.raises(SandboxError):
        sb.read_file("/etc/passwd")
    with pytest.raises(SandboxError):
        sb.read_file("no/such/file")


def test_time_limit_kills_the_process_tree(sb):
    script = ("import signal, subprocess, sys, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
              "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
              "time.sleep(600)\n")
    sb.write_files({"hang.py": script})
    t0 = time.monotonic()
    res = sb.exec([sb.python, "hang.py"], timeout=2)
    assert time.monotonic() - t0 < 10
    assert res.timed_out or res.returncode in (-9, 137)
    left = sb.exec(["sh", "-c", "ps -eo args 2>/dev/null | grep -c '[t]ime.sleep(600)' || true"], timeout=30)
    assert left.stdout.strip() in ("0", ""), left.stdout


def test_output_is_capped(sb):
    res = sb.exec([sb.python, "-c", "print('x' * 3_000_000)"], timeout=60)
    assert res.truncated and len(res.stdout) < 1_200_000


def test_hardware_and_python(sb):
    hw = sb.hardware()
    assert hw.cpu_count >= 1 and hw.torch and len(hw.fingerprint) == 16
    res = sb.exec([sb.python, "-c", "import commbench_env, torch; print('ok')"], timeout=60)
    assert res.stdout.strip() == "ok", res.stderr


def test_close_is_idempotent_and_final(sb):
    sb.close()
    sb.close()
    assert not sb.alive
