"""A warm judge server (a zygote): torch imported once, then one forked coordinator per evaluation.

It never runs candidate code itself, so nothing leaks from one evaluation into the next: every evaluation gets
freshly forked coordinator and rank processes and a fresh folder. It exits when its socket file disappears
(the sandbox was closed), when its owner process dies, or after an idle timeout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from .protocol import recv_msg, send_msg

RESULT_MARK = "COMMBENCH-RESULT "


def _preload() -> None:
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.profiler  # noqa: F401

    from .. import cards, golden  # noqa: F401
    from . import coordinator, rank  # noqa: F401

    golden.op_names()
    from .cuda_build import detected_arch, nvcc_version

    nvcc_version(), detected_arch()  # asked once here, inherited by every forked coordinator


def _owner_alive(pid: int) -> bool:
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def handle_request(raw: bytes) -> str:
    """Run one evaluation in this (forked) process and return the JudgeResult as JSON."""
    from .coordinator import evaluate
    from .request import JudgeRequest

    req = JudgeRequest.model_validate_json(raw)
    return evaluate(req).model_dump_json()


def serve(socket_path: str, owner_pid: int, idle_timeout: float, ready_fd: int | None = None) -> None:
    _preload()
    path = Path(socket_path)
    if path.exists():
        path.unlink()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    os.chmod(path, 0o600)
    srv.listen(16)
    srv.settimeout(1.0)
    ino = path.stat().st_ino
    if ready_fd is not None:
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
    children: set[int] = set()
    last = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    try:
        while True:
            for pid in list(children):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    children.discard(pid)
            try:
                gone = path.stat().st_ino != ino
            except FileNotFoundError:
                gone = True
            if gone or not _owner_alive(owner_pid):
                return
            if not children and time.monotonic() - last > idle_timeout:
                return
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                continue
            last = time.monotonic()
            conn.settimeout(10)
            try:
                header, blob = recv_msg(conn)
            except (EOFError, OSError, ValueError):
                conn.close()
                continue
            if header.get("cmd") == "stop":
                conn.close()
                return
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    srv.close()
                    os.setsid()
                    out = handle_request(blob)
                    conn.settimeout(None)
                    send_msg(conn, {"ok": True}, out.encode())
                except BaseException as exc:  # noqa: BLE001 - report anything to the client
                    code = 1
                    try:
                        send_msg(conn, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                    except OSError:
                        pass
                finally:
                    os._exit(code)
            children.add(pid)
            conn.close()
    finally:
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            if path.exists() and path.stat().st_ino == ino:
                path.unlink()
        except OSError:
            pass


def start_daemon(socket_path: str, owner_pid: int, idle_timeout: float) -> int:
    """Double-fork a detached server; return once it listens (0) or failed (1)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        log = os.open(str(Path(socket_path).with_suffix(".log")), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        code = 0
        try:
            serve(socket_path, owner_pid, idle_timeout, ready_fd=w)
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(w)
    os.waitpid(pid, 0)
    data = b""
    while True:
        chunk = os.read(r, 64)
        if not chunk:
            break
        data += chunk
    os.close(r)
    return 0 if data.startswith(b"ready") else 1


def forward(socket_path: str, raw: bytes, timeout: float) -> str | None:
    """Send a request to a running server; None if no server answers there (the caller then runs cold)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(socket_path)
    except OSError:
        s.close()
        return None
    try:
        s.settimeout(timeout)
        send_msg(s, {"cmd": "run"}, raw)
        header, blob = recv_msg(s)
    finally:
        s.close()
    if not header.get("ok"):
        raise RuntimeError(header.get("error", "judge server failed"))
    return blob.decode()


def stop(socket_path: str) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(socket_path)
        send_msg(s, {"cmd": "stop"})
    except OSError:
        pass
    finally:
        s.close()


def emit(result_json: str) -> None:
    sys.stdout.write(RESULT_MARK + result_json + "\n")
    sys.stdout.flush()


def _main_json(obj: dict) -> str:
    return json.dumps(obj)
