"""The coordinator's end of the framed channels to the processes that run candidate code.

Whatever arrives here was written by a process candidate code shares, so every frame is checked (sequence, length,
type) and anything the protocol does not allow is that process's runtime error, never the judge's. A process that
crashes, hangs or closes its channel ends the evaluation with a verdict that names it.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...paths import PACKAGE_DIR
from ..host.result import RankStatus, Verdict, Violation
from ..protocol import ProtocolError, Reader, decode_tensors, pack, split_inputs
from .fabric import Fabric, FabricError
from .stacks import candidate_stack

Message = tuple[dict, bytes]


class RankFailure(Exception):
    """A rank crashed, hung, raised, or broke protocol; carries the verdict to report."""

    def __init__(self, verdict: Verdict, summary: str, case: str | None = None):
        super().__init__(summary)
        self.verdict, self.summary, self.case = verdict, summary, case

    @classmethod
    def protocol(cls, who: str, what: object, case: str | None = None) -> "RankFailure":
        """`who` sent something the judge's protocol does not allow: its runtime error (candidate code in that
        process can write anything on its channel), never the judge's."""
        return cls(Verdict.runtime_error, f"{who} broke the judge's protocol: {what}", case)


@dataclass
class RankProc:
    """One candidate process and the coordinator's end of its channel."""
    rank: int
    pid: int
    sock: socket.socket
    reader: Reader = field(default_factory=Reader)
    sent: int = 0  # frames sent on this channel (each carries its number)
    state: str = "ok"
    exit_code: int | None = None
    signal: int | None = None
    violations: list[dict] = field(default_factory=list)


class Links:
    """The channels to one evaluation's candidate processes (a rank each, or the one device host), under one
    deadline."""

    def __init__(self, deadline: float, timeout_s: float, workdir: Path, entry_file: str = ""):
        self.deadline, self.timeout_s, self.workdir = deadline, timeout_s, workdir
        self.entry_file = entry_file
        self.procs: list[RankProc] = []
        self.case_limit: tuple[float, float] | None = None  # (deadline, seconds) of the case being run
        self.fabric: Fabric | None = None  # CPU ranks: their messages to each other come through here

    @contextmanager
    def per_case(self, seconds: float) -> Iterator[None]:
        """A case's own limit inside the evaluation's: a deadlock costs `seconds`, not the whole time limit."""
        self.case_limit = (time.monotonic() + seconds, seconds)
        try:
            yield
        finally:
            self.case_limit = None

    def add(self, rank: int, pid: int, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.procs.append(RankProc(rank=rank, pid=pid, sock=sock))

    def __bool__(self) -> bool:
        return bool(self.procs)

    # ---- sending --------------------------------------------------------------------------------------
    def send(self, r: int, header: dict[str, Any], blob: bytes = b"") -> None:
        rp = self.procs[r]
        data = pack(header, blob, rp.sent)
        rp.sent += 1
        rp.sock.setblocking(True)
        rp.sock.settimeout(max(0.1, self.deadline - time.monotonic()))
        try:
            rp.sock.sendall(data)
        except (OSError, socket.timeout):
            self.reap(rp)
            raise RankFailure(Verdict.runtime_error, f"rank {rp.rank} stopped accepting messages ({self.describe(rp)})")
        finally:
            rp.sock.setblocking(False)

    def send_all(self, header: dict[str, Any] | Callable[[int], dict[str, Any]]) -> None:
        """The same header to every process, or `header(r)` to process `r`."""
        for r in range(len(self.procs)):
            self.send(r, header(r) if callable(header) else header)

    def release(self, case: str | None) -> list[int]:
        """Wait until every process has staged its inputs, then release them; each one's release time (ns)."""
        self.gather(range(len(self.procs)), "staged", case)
        released = []
        for r in range(len(self.procs)):
            released.append(time.perf_counter_ns())
            self.send(r, {"cmd": "go"})
        return released

    # ---- receiving ------------------------------------------------------------------------------------
    def gather(self, ranks: Iterable[int], expect: str, case: str | None = None,
               then: Callable[[int, Message], str | None] | None = None) -> dict[int, Message]:
        """Wait for one message from each process in `ranks`; fail with a verdict naming who crashed or hung.
        `then(rank, message)`, if given, sees each message at once and may name the next message that process owes
        (a dialogue of several steps per process, run for all of them together); the last message is returned."""
        pending = set(ranks)
        waiting = {r: expect for r in pending}
        got: dict[int, Message] = {}
        sel = selectors.DefaultSelector()
        for r in pending:
            sel.register(self.procs[r].sock, selectors.EVENT_READ, r)
        try:
            while pending:
                for r in list(pending):
                    msg = self.pop(r, case)
                    while msg is not None:
                        if msg[0].get("type") == "net":
                            self.carry(r, msg, case)
                            msg = self.pop(r, case)
                            continue
                        self.absorb(r, msg, waiting[r], case)
                        nxt = then(r, msg) if then else None
                        if not nxt:
                            got[r] = msg
                            pending.discard(r)
                            sel.unregister(self.procs[r].sock)
                            break
                        waiting[r] = nxt
                        msg = self.pop(r, case)
                if not pending:
                    break
                deadline = self.deadline if self.case_limit is None else min(self.deadline, self.case_limit[0])
                left = deadline - time.monotonic()
                if left <= 0:
                    self.hang(sorted(pending), case)
                for key, _ in sel.select(timeout=min(left, 1.0)):
                    self.read_some(self.procs[key.data], case)
        finally:
            sel.close()
        return got

    def carry(self, r: int, msg: Message, case: str | None) -> None:
        """A fabric frame: route it and send what it releases (a rank's misuse of the fabric is its failure)."""
        if self.fabric is None:
            raise RankFailure.protocol(f"rank {r}", "a fabric frame where no fabric runs", case)
        try:
            replies = self.fabric.handle(r, msg[0], msg[1])
        except FabricError as exc:
            if exc.rule:
                v = {"rule": exc.rule, "detail": exc.text, "where": "runtime"}
                if v not in self.procs[exc.rank].violations:
                    self.procs[exc.rank].violations.append(v)
                raise RankFailure(Verdict.forbidden, exc.text, case) from None
            raise RankFailure(Verdict.runtime_error, exc.text + (f" (case {case})" if case else ""), case) from None
        for rank, header, blob in replies:
            self.send(rank, header, blob)

    def one(self, expect: str, case: str | None = None) -> Message:
        """The next message of the only process (the device host)."""
        return self.gather([0], expect, case)[0]

    def pop(self, r: int, case: str | None) -> Message | None:
        """The next whole frame from process `r`, if one is buffered; a malformed or out-of-order frame is that
        process's runtime error (its code can write anything on its channel)."""
        try:
            return self.procs[r].reader.pop()
        except ProtocolError as exc:
            raise RankFailure.protocol(f"rank {r}", exc, case) from None

    def read_some(self, rp: RankProc, case: str | None) -> None:
        """Read what process `rp` has sent; a channel closed with no whole frame left is a crash."""
        try:
            data = rp.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        rp.reader.feed(data)
        if not data and not rp.reader.has_frame():  # a whole frame still buffered is read first
            self.reap(rp, wait=0.5)
            raise RankFailure(Verdict.runtime_error,
                              f"rank {rp.rank} {self.describe(rp)} before reporting" + (f" (case {case})" if case else ""),
                              case)

    def absorb(self, r: int, msg: Message, expect: str, case: str | None) -> None:
        """Take a message's rule reports, and fail on an error, a hang report or an unexpected type."""
        header = msg[0]
        rp = self.procs[r]
        violations = header.get("violations") or []
        if not isinstance(violations, list) or not all(isinstance(v, dict) and isinstance(v.get("detail"), str)
                                                       for v in violations):
            raise RankFailure.protocol(f"rank {r}", "malformed violations", case)
        for v in violations:
            if v not in rp.violations:
                rp.violations.append({k: str(v[k]) for k in ("rule", "detail", "where") if k in v})
        kind = header.get("type")
        if kind == "load_error":
            if rp.violations:
                raise RankFailure(Verdict.forbidden, f"rank {r} broke a rule while loading: {rp.violations[0]['detail']}")
            raise RankFailure(Verdict.runtime_error, f"loading the candidate failed on rank {r}:\n{header.get('error', '')}")
        if kind == "error":
            if rp.violations:
                raise RankFailure(Verdict.forbidden, f"rank {r} broke a rule: {rp.violations[0]['detail']}", case)
            raise RankFailure(Verdict.runtime_error, f"rank {r} raised" + (f" in case {case}" if case else "")
                              + f":\n{header.get('error', '')}", case)
        if kind == "hung":  # the device host's watchdog: ranks whose kernels never returned
            raise RankFailure(Verdict.timeout, f"time limit of {self.timeout_s:g}s reached; "
                              + str(header.get("error", "")) + (f" (case {case})" if case else ""), case)
        if kind != expect:
            raise RankFailure(Verdict.runtime_error, f"rank {r} sent {kind!r} where {expect!r} was expected", case)

    def tensors(self, r: int, msg: Message, case: str | None, who: str = "") -> dict[str, Any]:
        """The tensors of a message; a malformed message is its sender's failure."""
        try:
            return decode_tensors(msg[0].get("outputs"), msg[1])
        except ProtocolError as exc:
            raise RankFailure.protocol(who or f"rank {r}", exc, case) from None

    def decode(self, r: int, msg: Message, case: str | None) -> tuple[dict, dict]:
        """A rank's tensors as (outputs, the read-only inputs it sent back)."""
        return split_inputs(self.tensors(r, msg, case))

    # ---- process state --------------------------------------------------------------------------------
    def describe(self, rp: RankProc) -> str:
        if rp.signal:
            name = signal.Signals(rp.signal).name if rp.signal in signal.Signals._value2member_map_ else str(rp.signal)
            return f"was killed by {name}" + (" (CPU time limit)" if rp.signal == signal.SIGXCPU else "")
        if rp.exit_code is not None:
            return f"exited with code {rp.exit_code}"
        return "closed its channel"

    def reap(self, rp: RankProc, wait: float = 0.0) -> None:
        end = time.monotonic() + wait
        while True:
            try:
                pid, status = os.waitpid(rp.pid, os.WNOHANG)
            except ChildProcessError:
                return
            if pid:
                if os.WIFSIGNALED(status):
                    rp.signal, rp.state = os.WTERMSIG(status), "crashed"
                else:
                    rp.exit_code = os.WEXITSTATUS(status)
                    rp.state = "exited_early" if rp.exit_code == 0 else "crashed"
                return
            if time.monotonic() >= end:
                return
            time.sleep(0.01)

    def hang(self, pending: list[int], case: str | None) -> None:
        for r in pending:
            self.procs[r].state = "hung"
            try:
                os.kill(self.procs[r].pid, signal.SIGUSR1)  # faulthandler dumps the Python stacks
            except ProcessLookupError:
                pass
        time.sleep(0.3)
        if self.case_limit is not None and self.case_limit[0] < self.deadline:
            what = f"a case's time limit of {self.case_limit[1]:g}s"
        else:
            what = f"the time limit of {self.timeout_s:g}s"
        stuck = self.fabric.stuck(pending) if self.fabric is not None else []
        raise RankFailure(Verdict.timeout, f"{what} reached; rank(s) {', '.join(map(str, pending))} did not finish"
                          + (f" case {case}" if case else "") + " (a deadlock? see each rank's stack)"
                          + "".join(f"\n  {line}" for line in stuck), case)

    def shutdown(self) -> None:
        """Ask every live process to exit, then kill what is left (and anything left in its session)."""
        for rp in self.procs:
            if rp.state == "ok":
                try:
                    rp.sock.setblocking(True)
                    rp.sock.settimeout(0.2)
                    rp.sock.sendall(pack({"cmd": "exit"}, b"", rp.sent))
                except OSError:
                    pass
        end = time.monotonic() + 1.0
        for rp in self.procs:
            if rp.state == "ok":
                self.reap(rp, wait=max(0.0, end - time.monotonic()))
                if rp.exit_code == 0:
                    rp.state = "ok"  # asked to exit, and did
        for rp in self.procs:
            if rp.exit_code is None and rp.signal is None:
                for kill in (lambda: os.killpg(rp.pid, signal.SIGKILL), lambda: os.kill(rp.pid, signal.SIGKILL)):
                    try:
                        kill()
                    except (ProcessLookupError, PermissionError):
                        pass
                was = rp.state
                self.reap(rp, wait=2.0)
                if was == "hung":
                    rp.state = "hung"
                elif was == "ok":
                    rp.state = "killed"
            else:
                try:  # anything the process left behind in its session goes too
                    os.killpg(rp.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            rp.sock.close()

    def _stack(self, path: Path, limit: int) -> str:
        dump = _tail(path, 1 << 16)
        if not self.entry_file:
            return dump[-limit:]
        try:
            source = (self.workdir / "candidate" / self.entry_file).read_text(errors="replace")
        except OSError:
            source = ""
        return candidate_stack(dump, self.entry_file, str(PACKAGE_DIR), source)[-limit:]

    def statuses(self, passed: bool, limit: int) -> tuple[list[RankStatus], list[Violation]]:
        """Each process's end state and output tails, and the rules it reported broken."""
        statuses, violations = [], []
        for rp in self.procs:
            rdir = self.workdir / f"rank{rp.rank}"
            state = rp.state
            if state == "exited_early" and rp.exit_code == 0 and passed:
                state = "ok"
            statuses.append(RankStatus(
                rank=rp.rank, state=state, exit_code=rp.exit_code, signal=rp.signal,
                stdout=_tail(rdir / "stdout.txt", limit), stderr=_tail(rdir / "stderr.txt", limit),
                stack=self._stack(rdir / "stack.txt", limit) if rp.state == "hung" else None))
            for v in rp.violations:
                vv = Violation(rank=rp.rank, **{k: v[k] for k in ("rule", "detail", "where") if k in v})
                if vv not in violations:
                    violations.append(vv)
        return statuses, violations


def _tail(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return (f"[... {size - limit} bytes cut ...]\n" + text) if size > limit else text
