"""A warm judge server (a zygote): torch imported once, then one forked coordinator per evaluation.

It never runs candidate code and never reads a request's body (the secret and hidden cases): it reads only a
frame's header, checks the client (same uid, over SO_PEERCRED, and the token the host gave it at start), and forks
a coordinator, which forks its secretless spawner before it reads the body (judge/coordinator/spawner.py). So nothing leaks
from one evaluation into the next, and no candidate process ever starts from memory that held a secret. It exits
when its socket file disappears (the sandbox was closed), when its owner process dies, or after an idle timeout.
"""

from __future__ import annotations

import hmac
import os
import struct
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..protocol import RESULT_MARK, ProtocolError, recv_blob, recv_header, recv_msg, send_msg

if TYPE_CHECKING:
    from .spawner import Spawner



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


def handle_request(raw: bytes, spawner: "Spawner") -> str:
    """Run one evaluation in this process and return the JudgeResult as JSON. `spawner` was forked before `raw`
    (which holds the secret) was read."""
    from .evaluation import evaluate
    from ..host.request import JudgeRequest

    req = JudgeRequest.model_validate_json(raw)
    return evaluate(req, spawner).model_dump_json()


def run_isolated(read_request: "Callable[[], bytes]", preload: bool = False) -> str:
    """Evaluate in this process: fork the secretless spawner first, only then read the request (which holds the
    secret). `preload`: the spawner imports what ranks need at its first spawn (no warm server did)."""
    from .spawner import Spawner

    spawner = Spawner(preload=preload)
    try:
        return handle_request(read_request(), spawner)
    finally:
        spawner.close()


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[2]


def _evaluate_connection(conn: socket.socket, blen: int) -> None:
    """In the forked coordinator: the evaluation of the request body that follows on `conn`."""
    conn.settimeout(30)
    out = run_isolated(lambda: recv_blob(conn, blen))
    conn.settimeout(None)
    send_msg(conn, {"ok": True}, out.encode())


def serve(socket_path: str, owner_pid: int, idle_timeout: float, token: str, ready_fd: int | None = None) -> None:
    from .spawner import load_modules

    load_modules()
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
                if _peer_uid(conn) != os.getuid():
                    raise ProtocolError("client of another user")
                header, blen = recv_header(conn)
                if not hmac.compare_digest(str(header.get("token", "")), token):
                    send_msg(conn, {"ok": False, "error": "the judge server refused a client without its token"})
                    raise ProtocolError("bad token")
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
                    _evaluate_connection(conn, blen)
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


def start_daemon(socket_path: str, owner_pid: int, idle_timeout: float, token: str) -> int:
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
            serve(socket_path, owner_pid, idle_timeout, token, ready_fd=w)
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


def connect(socket_path: str | None) -> socket.socket | None:
    """A connection to a running server, or None (the caller then evaluates cold)."""
    if not socket_path or not os.path.exists(socket_path):
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(socket_path)
    except OSError:
        s.close()
        return None
    return s


def forward(s: socket.socket, token: str, raw: bytes, timeout: float) -> str:
    """Send a request to the server on `s` and return its result."""
    try:
        s.settimeout(timeout)
        send_msg(s, {"cmd": "run", "token": token}, raw)
        header, blob = recv_msg(s)
    finally:
        s.close()
    if not header.get("ok"):
        raise RuntimeError(header.get("error", "judge server failed"))
    return blob.decode()


def stop(socket_path: str, token: str) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(socket_path)
        send_msg(s, {"cmd": "stop", "token": token})
    except OSError:
        pass
    finally:
        s.close()


def emit(result_json: str) -> None:
    sys.stdout.write(RESULT_MARK + result_json + "\n")
    sys.stdout.flush()

