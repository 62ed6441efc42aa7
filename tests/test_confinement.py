"""The kernel layers of a rank (judge/candidate/confine.py), tried with raw libc calls, which no audit hook or tripwire sees.

A fresh interpreter lays out a sandbox as the judge does (two rank folders of one evaluation), starts a peer
process, confines itself as a rank does, and reports what each attempt returned. Native code in a rank can do
exactly these calls, so only what the kernel refuses here is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from pathlib import Path

import pytest

import commbench_env
from commbench_env.judge.candidate import landlock, seccomp_filter
from commbench_env.paths import tasks_dir

SCRIPT = textwrap.dedent(r"""
    import ctypes, errno, json, os, sys, tempfile, time
    from pathlib import Path
    sandbox = Path(tempfile.mkdtemp(prefix="commbench-confine-"))
    os.environ["COMMBENCH_SANDBOX"] = str(sandbox)
    ev = sandbox / "evals" / "e1"
    for r in ("rank0", "rank1"):
        (ev / r).mkdir(parents=True)
    (ev / "rank0" / "stdout.txt").write_text("rank 0's input")
    (sandbox / "judge.sock.log").write_text("server log")
    peer = os.fork()
    if peer == 0:  # a peer rank: it lets go of the pipes so that the test need not wait for it
        os.close(1), os.close(2)
        time.sleep(30)
        os._exit(0)
    os.chdir(ev / "rank1")
    from commbench_env.judge.candidate.confine import confine
    class Cpu:
        is_cuda, backend = False, "gloo"
    iso = confine({"landlock": True}, Cpu())
    libc = ctypes.CDLL(None, use_errno=True)
    def opened(path, flags=os.O_RDONLY):
        fd = libc.open(path.encode(), flags, 0o600)
        if fd < 0:
            return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
        libc.close(fd)
        return "ok"
    W = os.O_WRONLY | os.O_CREAT
    res = {
        "iso": iso,
        "peer_folder": opened(str(ev / "rank0" / "stdout.txt")),
        "sandbox_root": opened(str(sandbox / "judge.sock.log")),
        "task_card": opened(sys.argv[1]),
        "peer_proc": opened(f"/proc/{peer}/cmdline"),
        "peer_proc_odd_path": opened(f"/proc/./{peer}/../{peer}/status"),
        "parent_proc": opened(f"/proc/{os.getppid()}/environ"),
        "own_proc": opened("/proc/self/status"),
        "own_write": opened(str(ev / "rank1" / "x.bin"), W),
        "peer_write": opened(str(ev / "rank0" / "x.bin"), W),
        "tmp_write": opened("/tmp/commbench-confine-escape", W),
        "library_read": opened(os.__file__),
        "package_read": opened(sys.argv[2]),
        "beside_package": opened(sys.argv[3]),
        "fork": "ok" if libc.fork() >= 0 else errno.errorcode[ctypes.get_errno()],
        "socket": "ok" if libc.socket(2, 1, 0) >= 0 else errno.errorcode[ctypes.get_errno()],
        "kill_peer": "ok" if libc.kill(peer, 0) == 0 else errno.errorcode[ctypes.get_errno()],
    }
    print(json.dumps(res))
    os._exit(0)
""")


@pytest.mark.skipif(not landlock.abi_version() or seccomp_filter.available() is not None,
                    reason="needs Landlock and seccomp in this kernel")
def test_a_confined_rank_reaches_only_its_own_folder_and_process():
    card = tasks_dir() / "collective" / "allreduce_ring" / "task.toml"
    golden = Path(commbench_env.__file__).parent / "golden" / "base.py"  # the package a rank runs on: readable
    beside = Path(commbench_env.__file__).parent.parent / "pyproject.toml"  # the checkout (runs/, traces): not
    if not beside.exists():
        beside = card
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(card), str(golden), str(beside)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res.pop("iso")["seccomp"] is True
    assert res == {
        "peer_folder": "EACCES", "sandbox_root": "EACCES", "task_card": "EACCES", "peer_proc": "EACCES",
        "peer_proc_odd_path": "EACCES", "parent_proc": "EACCES", "own_proc": "ok", "own_write": "ok",
        "peer_write": "EACCES", "tmp_write": "EACCES", "library_read": "ok", "package_read": "ok",
        "beside_package": "EACCES", "fork": "EPERM", "socket": "EPERM",
        "kill_peer": "EPERM",
    }
