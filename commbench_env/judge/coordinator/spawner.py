"""The spawner: the only process that forks candidate processes, and one that never held a secret.

A forked process inherits its parent's whole memory, and candidate code can read its own memory (`/proc/self/mem`,
raw pointers). So candidate processes must not be forked from the coordinator, which holds the evaluation's
secret and hidden cases. The coordinator forks a spawner first thing, before it reads its request; the spawner
then forks each rank (or the CUDA device host) on the coordinator's demand, with only what that process may know
(the card without its cases, limits, its channel's descriptor passed over SCM_RIGHTS).

Ranks are forked through an intermediate that exits at once, so they are re-parented to the coordinator, which is a
child subreaper: it reaps them, reads their exit status, and when it dies they get SIGKILL (a parent-death signal
set once the re-parenting is seen). Nothing a rank started can outlive it: the rank's seccomp filter forbids
process creation (judge/candidate/seccomp_filter.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import struct
import time
from pathlib import Path
from typing import Any, NoReturn

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
_libc = ctypes.CDLL(None, use_errno=True)
_MAX_SPEC = 8 << 20


def become_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it (so it can reap the ranks)."""
    return _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def die_with_parent(expected_parent: int, wait_s: float = 5.0) -> None:
    """Wait until this process's parent is `expected_parent`, then ask for SIGKILL when that parent dies. Exits at
    once if the parent is already gone (the coordinator was killed before the rank was ready)."""
    end = time.monotonic() + wait_s
    while os.getppid() != expected_parent:
        if time.monotonic() > end:
            os._exit(4)
        time.sleep(0.0005)
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != expected_parent:  # it died between the check and the prctl
        os._exit(4)


def _send(sock: socket.socket, obj: dict[str, Any], fds: list[int] = ()) -> None:
    data = json.dumps(obj).encode()
    msg = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(sock, [msg], list(fds))
    else:
        sock.sendall(msg)


def _recv(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    head, fds, _, _ = socket.recv_fds(sock, 4, 4)
    if len(head) < 4:
        if not head:
            raise EOFError("spawner channel closed")
        head += sock.recv(4 - len(head), socket.MSG_WAITALL)
    (n,) = struct.unpack("!I", head)
    if n > _MAX_SPEC:
        raise ValueError("spawn request too large")
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("spawner channel closed")
        data += chunk
    return json.loads(data), list(fds)


def load_modules() -> None:
    """Import what evaluations need, once, so that forked coordinators and ranks start warm."""
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.profiler  # noqa: F401

    from ... import cards, golden  # noqa: F401
    from . import evaluation  # noqa: F401
    from ..candidate import dispatch_guard, fabric_group, rank, seccomp_filter  # noqa: F401

    golden.op_names()
    seccomp_filter.available()  # loads libseccomp (its lookup runs ldconfig) before any rank is confined
    from .cuda_build import detected_arch, nvcc_version

    nvcc_version(), detected_arch()  # asked once here, inherited by every forked coordinator


class Spawner:
    """Handle on a spawner process, held by the coordinator. Create it before reading anything secret."""

    def __init__(self, preload: bool = False):
        if not become_subreaper():
            raise OSError("prctl(PR_SET_CHILD_SUBREAPER) failed; ranks could not be reaped")
        mine, theirs = socket.socketpair()
        coordinator = os.getpid()
        pid = os.fork()
        if pid == 0:
            mine.close()
            _spawner_main(theirs, coordinator, preload)
        theirs.close()
        self.pid, self.sock = pid, mine

    def spawn(self, kind: str, channel: socket.socket, **args: Any) -> int:
        """Fork a `kind` process ("rank" or "device_host") that talks on `channel`; returns its pid."""
        _send(self.sock, {"kind": kind, **args}, [channel.fileno()])
        reply, _ = _recv(self.sock)
        if "pid" not in reply:
            raise OSError(f"the spawner could not start a {kind}: {reply.get('error', 'no reply')}")
        return int(reply["pid"])

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def _spawner_main(sock: socket.socket, coordinator: int, preload: bool) -> NoReturn:
    code = 0
    try:
        die_with_parent(coordinator)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)  # the coordinator's stdin may still hold its request, unread
        os.closerange(3, sock.fileno())
        os.closerange(sock.fileno() + 1, 1 << 16)
        while True:
            try:
                req, fds = _recv(sock)
            except EOFError:
                break
            if preload:
                load_modules()  # once, so that every rank starts with torch imported
                preload = False
            try:
                pid = _fork_detached(req, fds, coordinator)
                _send(sock, {"pid": pid})
            except Exception as exc:  # noqa: BLE001 - told to the coordinator, which fails the evaluation
                _send(sock, {"error": f"{type(exc).__name__}: {exc}"})
            finally:
                for fd in fds:
                    os.close(fd)
    except BaseException:  # noqa: BLE001
        code = 1
    os._exit(code)


def _fork_detached(req: dict[str, Any], fds: list[int], coordinator: int) -> int:
    """Fork the process through an intermediate that exits at once, so that it is re-parented to the coordinator."""
    if len(fds) != 1:
        raise ValueError("a spawn request carries exactly one channel")
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:
        os.close(r)
        pid = os.fork()
        if pid == 0:
            os.close(w)
            _child_main(req, fds[0], coordinator)
        os.write(w, str(pid).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 32):
        data += chunk
    os.close(r)
    os.waitpid(mid, 0)
    if not data:
        raise OSError("fork failed in the spawner")
    return int(data)


def _child_main(req: dict[str, Any], fd: int, coordinator: int) -> NoReturn:
    die_with_parent(coordinator)
    channel = socket.socket(fileno=fd)
    workdir = Path(req["workdir"])
    if req["kind"] == "rank":
        from ..candidate.rank import rank_main

        rank_main(int(req["rank"]), int(req["world"]), channel, req["spec"], workdir)
    if req["kind"] == "device_host":
        from ..candidate.device_host import device_host_main

        device_host_main(int(req["world"]), channel, req["spec"], workdir, req["library"])
    os._exit(5)
