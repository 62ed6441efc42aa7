"""Judge entry inside the sandbox: `python -m commbench_env.judge run|serve|stop`.

The host starts it isolated (`python -I`, see `protocol.judge_command`): no start directory or user site on
sys.path, so a package a candidate left in the sandbox is never imported by a later judge. `run` reads the host's token (first
line) and a JudgeRequest (JSON) on stdin and prints the result after a marker on stdout; `serve` and `stop` read
the token on stdin. It is kept import-light so that forwarding to a warm server costs a few tens of milliseconds.
"""

from __future__ import annotations

import argparse
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

    from .coordinator import server
    from .candidate.isolate import no_dump

    no_dump()  # the token and the secret arrive on stdin: no other process may read this one's memory
    token = sys.stdin.buffer.readline().decode(errors="replace").strip()
    if a.cmd == "serve":
        if a.foreground:
            server.serve(a.socket, a.owner_pid, a.idle_timeout, token)
            return 0
        return server.start_daemon(a.socket, a.owner_pid, a.idle_timeout, token)
    if a.cmd == "stop":
        server.stop(a.socket, token)
        return 0
    conn = server.connect(a.server)
    if conn is not None:
        out = server.forward(conn, token, sys.stdin.buffer.read(), a.timeout)
    else:  # cold: the spawner is forked before the request is read
        out = server.run_isolated(sys.stdin.buffer.read, preload=True)
    server.emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
