"""Judge entry inside the sandbox: `python -m commbench_env.judge run|serve|stop`.

`run` reads a JudgeRequest (JSON) on stdin and prints the result after a marker on stdout. It is kept
import-light so that forwarding to a warm server costs a few tens of milliseconds.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m commbench_env.judge")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="evaluate the request on stdin")
    r.add_argument("--server", help="socket of a warm judge server to use if it is running")
    r.add_argument("--timeout", type=float, default=600.0)
    s = sub.add_parser("serve", help="start a warm judge server")
    s.add_argument("--socket", required=True)
    s.add_argument("--owner-pid", type=int, default=0)
    s.add_argument("--idle-timeout", type=float, default=900.0)
    s.add_argument("--foreground", action="store_true")
    t = sub.add_parser("stop", help="stop a warm judge server")
    t.add_argument("--socket", required=True)
    a = p.parse_args(argv)

    from . import server

    if a.cmd == "serve":
        if a.foreground:
            server.serve(a.socket, a.owner_pid, a.idle_timeout)
            return 0
        return server.start_daemon(a.socket, a.owner_pid, a.idle_timeout)
    if a.cmd == "stop":
        server.stop(a.socket)
        return 0
    from .isolate import no_dump

    no_dump()  # the secret arrives on stdin: other processes of this user must not read this one's memory
    raw = sys.stdin.buffer.read()
    out = server.forward(a.server, raw, a.timeout) if a.server and os.path.exists(a.server) else None
    if out is None:
        out = server.handle_request(raw)
    server.emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
