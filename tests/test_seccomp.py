"""The seccomp filter, checked for real: each test forks a child that confines itself and then tries something.

The child reports through a pipe and always leaves with os._exit, so a broken filter cannot leave a second pytest
running. torch is imported before any confine(), as in a rank.
"""

from __future__ import annotations

import ctypes
import errno
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from commbench_env.judge.candidate import seccomp_filter

pytestmark = pytest.mark.skipif(seccomp_filter.available() is not None,
                                reason=f"seccomp unavailable: {seccomp_filter.available()}")

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def outcome(fn: Callable[[], Any]) -> Any:
    """'ok' (or what fn returned, if not None), else the exception's class name and errno."""
    try:
        r = fn()
    except OSError as e:
        return (type(e).__name__, e.errno)
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, None)
    return "ok" if r is None else r


def _send(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj)
    view = memoryview(len(data).to_bytes(8, "little") + data)
    while view:
        view = view[os.write(fd, view):]


def _recv(fd: int, deadline: float) -> Any:
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError("child did not report in time")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise AssertionError("child exited without a report")
        buf += chunk
        if len(buf) >= 8 and len(buf) >= 8 + int.from_bytes(buf[:8], "little"):
            return pickle.loads(buf[8:])  # do not wait for EOF: a leaked grandchild may hold the pipe


def fork_child(body: Callable[[], Any]) -> tuple[int, int]:
    """Fork; the child runs body() and sends back ('ok', value) or ('error', repr). Returns (pid, read end)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            os.close(r)
            try:
                report: Any = ("ok", body())
            except BaseException as e:  # noqa: BLE001
                report = ("error", repr(e))
            _send(w, report)
        finally:
            os._exit(0)
    os.close(w)
    return pid, r


def collect(pid: int, r: int, timeout: float = 20.0) -> Any:
    try:
        kind, value = _recv(r, time.monotonic() + timeout)
    finally:
        os.close(r)
        end = time.monotonic() + 5
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > end:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.005)
    assert kind == "ok", value
    return value


def confined(body: Callable[[Any], Any], *, before: Callable[[], Any] = lambda: None,
             sockets: bool = False) -> Any:
    """Run before() unconfined, then confine(), then body(before's result), in a forked child; return body's."""
    def run() -> Any:
        state = before()
        reason = seccomp_filter.confine(allow_new_sockets=sockets)
        assert reason is None, reason
        return body(state)

    return collect(*fork_child(run))


EPERM = ("PermissionError", errno.EPERM)


def test_available_here():
    assert seccomp_filter.available() is None
    assert isinstance(seccomp_filter.POLICY, str) and "\n" not in seccomp_filter.POLICY


def test_fork_fails():
    def body(_):
        def go():
            if os.fork() == 0:
                os._exit(0)
        return outcome(go)

    assert confined(body) == EPERM


def test_subprocess_fails():
    assert confined(lambda _: outcome(lambda: subprocess.Popen(["true"]).wait())) == EPERM


def test_posix_spawn_fails():
    def body(_):
        return outcome(lambda: os.waitpid(os.posix_spawn("/bin/true", ["true"], dict(os.environ)), 0) and None)

    assert confined(body) == EPERM


def test_execv_fails():
    # had exec worked, the child would be `true` and exit without a report
    assert confined(lambda _: outcome(lambda: os.execv("/bin/true", ["true"]))) == EPERM


def _holders(marker: str, path: str) -> list[int]:
    """Processes other than this one with `marker` in their environment or `path` open."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            env = open(f"/proc/{d}/environ", "rb").read()
            fds = [os.readlink(f"/proc/{d}/fd/{fd}") for fd in os.listdir(f"/proc/{d}/fd")]
        except OSError:
            continue
        if marker.encode() in env or path in fds:
            out.append(int(d))
    return out


def test_no_detached_child(tmp_path):
    marker = f"COMMBENCH_SECCOMP_{uuid.uuid4().hex}"
    tag = str(tmp_path / marker)

    def before():
        os.environ[marker] = "1"  # a program it starts carries this in its environment,
        os.open(tag, os.O_CREAT | os.O_RDONLY)  # a copy of this process carries this descriptor

    def body(_):
        def raw_clone(flags: int):
            def go():
                r = libc.syscall(ctypes.c_long(56), ctypes.c_long(flags), None, None, None, None)
                if r == 0:
                    os._exit(0)  # a copy of this process: it must not carry on
                if r < 0:
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            return go

        def clone3():
            r = libc.syscall(ctypes.c_long(435), None, ctypes.c_size_t(0))
            raise OSError(ctypes.get_errno(), "clone3") if r < 0 else AssertionError(f"clone3 returned {r}")

        def daemon():  # the classic double fork into a new session
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    time.sleep(30)
                os._exit(0)

        return {
            "session": outcome(lambda: subprocess.Popen(["sleep", "30"], start_new_session=True) and None),
            "daemon": outcome(daemon),
            "clone_parent": outcome(raw_clone(0x00008000 | signal.SIGCHLD)),  # CLONE_PARENT: a sibling, not a child
            "clone3": outcome(clone3),
        }

    try:
        got = confined(body, before=before)
    finally:
        time.sleep(0.05)
        leaked = _holders(marker, tag)
        for pid in leaked:
            os.kill(pid, signal.SIGKILL)
    assert got == {"session": EPERM, "daemon": EPERM, "clone_parent": EPERM, "clone3": ("OSError", errno.ENOSYS)}
    assert leaked == []


def test_threads_still_work():
    def body(_):
        out = []
        ts = [threading.Thread(target=out.append, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return sorted(out)

    assert confined(body) == [0, 1, 2, 3]


# torch's OpenMP pool does not survive fork: a child of a process that already ran a parallel op hangs in its first
# one, filter or not. Other tests in the session may have run torch here, so the cases that run torch start from a
# fresh interpreter (which imports torch, then forks the confined children as above).
def fresh(case: str, tmp_path) -> Any:
    out = tmp_path / f"{case}.pickle"
    code = f"import pickle, tests.test_seccomp as t; pickle.dump(t.{case}(), open({str(out)!r}, 'wb'))"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    return pickle.loads(out.read_bytes())


def case_torch_threads() -> Any:
    def body(_):
        torch.set_num_threads(2)
        a = torch.arange(256 * 256, dtype=torch.float32).reshape(256, 256) / 65536
        c = a @ a.T
        return torch.get_num_threads(), bool(torch.allclose(c, (a.double() @ a.double().T).float(), rtol=1e-4))

    return confined(body)


def test_torch_threads_after_confine(tmp_path):
    assert fresh("case_torch_threads", tmp_path) == (2, True)


def case_existing_threads() -> Any:
    def before():
        torch.set_num_threads(4)
        a = torch.randn(512, 512)
        for _ in range(3):
            a = torch.tanh(a @ a)  # brings the intra-op pool's threads up before confine
        return len(os.listdir("/proc/self/task"))

    def body(n_before):
        a = torch.randn(512, 512)
        b = (a @ a).sum().item()
        modes = {}
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/status") as f:
                modes[tid] = next(line.split()[1] for line in f if line.startswith("Seccomp:"))
        return n_before, len(modes), set(modes.values()), b == b

    return confined(body, before=before)


def test_filter_covers_existing_torch_threads(tmp_path):
    n_before, n_after, modes, finite = fresh("case_existing_threads", tmp_path)
    assert n_before >= 4 and n_after >= n_before
    assert modes == {"2"}  # every thread, old and new, is filtered (TSYNC)
    assert finite


def test_new_sockets():
    make = lambda _: outcome(lambda: socket.socket().close())  # noqa: E731
    assert confined(make) == EPERM
    assert confined(make, sockets=True) == "ok"
    assert confined(lambda _: outcome(lambda: socket.socket(socket.AF_UNIX).close())) == EPERM
    assert confined(lambda _: outcome(lambda: socket.socketpair())) == EPERM


def test_existing_connection_keeps_working():
    def body(pair):
        a, b = pair
        a.sendall(b"ping")
        got = b.recv(4)
        b.sendmsg([b"pong"])
        return got, a.recvmsg(4)[0]

    assert confined(body, before=socket.socketpair) == (b"ping", b"pong")


def test_signals_only_to_itself():
    def body(_):
        hits = []
        signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)
        t.start()
        try:
            res = {
                "parent": outcome(lambda: os.kill(os.getppid(), 0)),
                "group": outcome(lambda: os.kill(0, 0)),
                "everyone": outcome(lambda: os.kill(-1, 0)),
                "own_group": outcome(lambda: os.killpg(os.getpgid(0), 0)),
                "self": outcome(lambda: os.kill(os.getpid(), 0)),
                "own_thread": outcome(lambda: signal.pthread_kill(t.ident, 0)),
                "raise": outcome(lambda: os.kill(os.getpid(), signal.SIGUSR1)),
            }
        finally:
            stop.set()
            t.join()
        time.sleep(0.01)
        res["handled"] = hits == [1]
        return res

    assert confined(body) == {"parent": EPERM, "group": EPERM, "everyone": EPERM, "own_group": EPERM,
                              "self": "ok", "own_thread": "ok", "raise": "ok", "handled": True}


def test_sysv_shm_fails():
    def body(_):
        shmget = libc.shmget
        shmget.argtypes = (ctypes.c_int, ctypes.c_size_t, ctypes.c_int)
        r = shmget(0, 4096, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
        if r >= 0:
            libc.shmctl(r, 0, None)  # IPC_RMID: do not leak the segment
            return r
        return ctypes.get_errno()

    assert confined(body) == errno.EPERM


def _raw(name: str, *args: int) -> Callable[[], int]:
    import pyseccomp

    nr = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)

    def go() -> int:
        r = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
        if r >= 0:
            if name == "pidfd_open":
                os.close(r)
            return r
        return -ctypes.get_errno()
    return go


def test_escape_syscalls_fail():
    # arguments chosen so that, unfiltered, each call would be harmless (a no-op, a query, or EINVAL/EFAULT)
    def body(_):
        pp = os.getppid()
        calls = {
            "ptrace": _raw("ptrace", 2, pp, 0, 0),  # PTRACE_PEEKDATA on an untraced process: ESRCH unfiltered
            "process_vm_readv": _raw("process_vm_readv", pp, 0, 0, 0, 0, 0),
            "pidfd_open": _raw("pidfd_open", pp, 0),
            "kcmp": _raw("kcmp", pp, os.getpid(), 0, 0, 0),
            "unshare": _raw("unshare", 0),
            "setns": _raw("setns", -1, 0),
            "mount": _raw("mount", 0, 0, 0, 0, 0),
            "bpf": _raw("bpf", 0xFFFF, 0, 0),
            "io_uring_setup": _raw("io_uring_setup", 0, 0),
            "userfaultfd": _raw("userfaultfd", 0xFFFF),
            "perf_event_open": _raw("perf_event_open", 0, 0, -1, -1, 0),
            "keyctl": _raw("keyctl", 0xFFFF, 0, 0, 0, 0),
            "personality": _raw("personality", 0xFFFFFFFF),
            "setuid": _raw("setuid", os.getuid()),
            "execveat": _raw("execveat", -1, 0, 0, 0, 0),
            "tkill": _raw("tkill", threading.get_native_id(), 0),
            "msgget": _raw("msgget", 0, 0),
            "mq_open": _raw("mq_open", 0, 0, 0, 0),
        }
        return {k: f() for k, f in calls.items()}

    got = confined(body)
    assert got == {k: -errno.EPERM for k in got}, got


def test_files_and_memory_still_work(tmp_path):
    def body(_):
        p = tmp_path / "x.txt"
        p.write_text("hello")
        import mmap

        m = mmap.mmap(-1, 1 << 20)
        m[:5] = b"abcde"
        return p.read_text(), bytes(m[:5]), time.monotonic() > 0

    assert confined(body) == ("hello", b"abcde", True)


def case_gloo() -> Any:
    """Two ranks as the judge runs them: TCPStore and gloo group first, then confine, then collectives."""
    port_r, port_w = os.pipe()

    def rank(r: int) -> Callable[[], Any]:
        def run() -> Any:
            timeout = timedelta(seconds=10)
            if r == 0:
                os.close(port_r)
                store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timeout, wait_for_workers=False)
                os.write(port_w, store.port.to_bytes(4, "little"))
            else:
                os.close(port_w)
                port = int.from_bytes(os.read(port_r, 4), "little")
                store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=timeout)
            dist.init_process_group("gloo", store=store, rank=r, world_size=2, timeout=timeout)
            reason = seccomp_filter.confine()
            assert reason is None, reason
            t = torch.arange(4, dtype=torch.float32) + 10 * r
            if r == 0:
                dist.send(t, dst=1)
                dist.recv(t, src=1)
            else:
                other = torch.empty(4)
                dist.recv(other, src=0)
                dist.send(t, dst=0)
                t = other
            s = torch.full((3,), float(r + 1))
            dist.all_reduce(s)
            return t.tolist(), s.tolist(), outcome(lambda: socket.socket().close())
        return run

    children = [fork_child(rank(r)) for r in (0, 1)]
    os.close(port_r)
    os.close(port_w)
    return [collect(pid, fd) for pid, fd in children]


def test_gloo_group_made_before_confine_keeps_working(tmp_path):
    got = fresh("case_gloo", tmp_path)
    assert got[0] == ([10.0, 11.0, 12.0, 13.0], [3.0, 3.0, 3.0], EPERM)
    assert got[1] == ([0.0, 1.0, 2.0, 3.0], [3.0, 3.0, 3.0], EPERM)


def test_confine_reports_instead_of_raising():
    # a second filter stacks on the first: confine twice in one child must succeed, never raise
    def body(_):
        return seccomp_filter.confine(), seccomp_filter.confine(allow_new_sockets=True)

    assert confined(body) == (None, None)
