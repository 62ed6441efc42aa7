"""The coordinator: builds nothing from candidate code, launches the ranks, feeds them seeds, verifies and times.

Stages are small functions: static_check -> launch -> rendezvous -> check -> benchmark -> profile -> collect.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import __version__
from ...cards import CaseSpec, TaskCard, bus_share_of_copy, busbw_factor
from ...golden import get_op
from ...golden.base import GoldenOp
from ...golden.compare import compare_tensor
from ..protocol import (ProtocolError, Reader, decode_tensors, derive_seed, pack, sample_positions, sample_together,
                       split_inputs)
from ..host.request import JudgeRequest
from ..host.result import (CaseResult, CompileReport, JudgeResult, Mismatch, RankProfile, RankStatus, Roofline,
                     SizeResult, Timings, Verdict, Violation, kernel_bandwidth)
from ..rules import expand_forbidden
from ..staging import usable_cores
from .static_check import check_source

if TYPE_CHECKING:
    from .spawner import Spawner

IMPLAUSIBLE_ROOFLINE_PCT = 300.0  # honest references peak near 105 % of the roofline the judge measures
IMPLAUSIBLE_MIN_BYTES = 1 << 20  # below this, latency dominates and no roofline applies
# What the GPU start line (syncs, the L2 reset, about 3 ms of warm-up, the device host's gate and threads) and the
# messages around the timed calls may take beyond the calls themselves. A rank's own timings may not claim less
# than GPU_BOUND_SHARE of the coordinator's window beyond this slack: a bound against forged figures, loose enough
# that host noise never raises an honest one (it bites only where calls take far longer than the slack).
GPU_START_SLACK_NS = 20_000_000
GPU_BOUND_SHARE = 0.5


def clock_floor(window_ns: int) -> int:
    """The least total a rank's own GPU timings may report for calls the coordinator saw take `window_ns`."""
    return int(GPU_BOUND_SHARE * (window_ns - GPU_START_SLACK_NS))
VERIFY_THREADS = 8  # timed iterations checked at once (each regenerates its inputs; torch releases the GIL)


def implausible_timing(roofline_pct: float | None, size_bytes: int, roofline_name: str) -> str | None:
    """Why a bandwidth is impossible, or None. Timings are taken inside the candidate's own process, so they are
    checked from outside too: a figure far above the roofline measured in the same evaluation means the clock was
    fooled, whatever the rank reported."""
    if roofline_pct is None or size_bytes < IMPLAUSIBLE_MIN_BYTES or roofline_pct <= IMPLAUSIBLE_ROOFLINE_PCT:
        return None
    return (f"measured {roofline_pct:.0f} % of the {roofline_name} roofline at {size_bytes} bytes; no transfer is "
            f"{IMPLAUSIBLE_ROOFLINE_PCT / 100:.0f}x faster than the hardware allows, so this timing cannot be right")


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
    rank: int
    pid: int
    sock: socket.socket
    reader: Reader = field(default_factory=Reader)
    sent: int = 0  # frames sent on this channel (each carries its number)
    state: str = "ok"
    exit_code: int | None = None
    signal: int | None = None
    violations: list[dict] = field(default_factory=list)


class Evaluation:
    def __init__(self, req: JudgeRequest, spawner: "Spawner | None" = None):
        self.req = req
        self.spawner = spawner
        self.store: Any = None
        self.card = TaskCard.model_validate(req.task["card"])
        self.op: GoldenOp = get_op(self.card.semantics.op)
        self.secret = bytes.fromhex(req.secret)
        self.workdir = Path(req.workdir)
        self.world = req.world_size
        self.timeout_s = req.timeout_s or self.card.limits.timeout_s
        self.deadline = time.monotonic() + self.timeout_s
        self.ranks: list[RankProc] = []
        self.timings = Timings()
        self.t_start = time.monotonic()
        self.result = JudgeResult(task_id=self.card.id, task_hash=req.task.get("task_hash", ""), mode=req.mode,
                                  world_size=self.world, device_mode=req.device_mode, verdict=Verdict.passed,
                                  judge_version=__version__, source_hash=req.source_hash)

    # ---- stage 1: static -------------------------------------------------------------------------------
    def static_check(self) -> bool:
        t0 = time.monotonic()
        entry = self.card.entry
        path = self.workdir / "candidate" / entry.file
        if not path.is_file():
            self.result.compile = CompileReport(ok=False, log=f"no file {entry.file!r} was submitted")
            self.result.verdict = Verdict.compile_error
            self.result.summary = f"{entry.file} is missing from the submission"
            return False
        if self.card.language.value == "cuda":
            return self.build_cuda(path, t0)
        source = path.read_text(errors="replace")
        forbidden, attrs = expand_forbidden(self.card.rules.forbidden_apis)
        rep = check_source(source, entry.file, forbidden, attrs, self.card.rules.extra_imports, entry.functions)
        violations = [Violation(**v) for v in rep.violations]
        if not self.req.static_check and not rep.syntax_error:
            violations, rep.ok = [], True
        self.result.compile = CompileReport(ok=rep.ok, log=rep.log, violations=violations)
        self.timings.compile_s = time.monotonic() - t0
        if rep.ok:
            return True
        forbidden_hits = [v for v in violations if v.rule not in ("import_error",)]
        if forbidden_hits:
            self.result.verdict = Verdict.forbidden
            self.result.violations = forbidden_hits
            self.result.summary = f"{len(forbidden_hits)} rule violation(s); first: line {forbidden_hits[0].line}: {forbidden_hits[0].detail}"
        else:
            self.result.verdict = Verdict.compile_error
            self.result.summary = (rep.log.splitlines() or ["compile error"])[-1]
        return False

    def build_cuda(self, path: Path, t0: float) -> bool:
        from .cuda_build import build

        spec = self.card.cuda
        assert spec is not None
        cache = Path(self.req.cache_dir) if self.req.cache_dir else self.workdir.parent / "cuda-cache"
        b = build(path, card_arch=spec.arch, links=spec.links, extra_flags=spec.nvcc_flags,
                  functions=self.card.entry.functions, cache_dir=cache, allow_symbols=spec.allow_symbols)
        self.library = b.library
        log = "\n".join(x for x in (b.log, "\n".join(b.ptxas)) if x)
        violations = [Violation(**v) for v in b.violations] if self.req.static_check else []
        self.result.compile = CompileReport(ok=b.ok and not violations, log=log, violations=violations,
                                            cache_hit=b.cache_hit, seconds=b.seconds)
        self.timings.compile_s = time.monotonic() - t0
        if not b.ok:
            self.result.verdict = Verdict.compile_error
            errors = [ln for ln in b.log.splitlines() if "error" in ln]
            self.result.summary = (errors or b.log.splitlines() or ["compile error"])[0][:300]
            return False
        if violations:
            self.result.verdict = Verdict.forbidden
            self.result.violations = violations
            self.result.summary = f"{len(violations)} rule violation(s); first: {violations[0].detail}"
            return False
        return True

    # ---- stage 2: launch + rendezvous --------------------------------------------------------------------
    def rank_spec(self) -> dict[str, Any]:
        """What a rank is started with: the card without its cases (a rank learns a case only when it must run
        it), limits, and where the coordinator's rendezvous store listens."""
        spec = {"card": self.card.model_dump(mode="json"), "timeout_s": self.timeout_s,
                "memory_mb": self.req.memory_mb or self.card.limits.memory_mb,
                "threads_per_rank": self.req.threads_per_rank or max(1, (os.cpu_count() or 1) // self.world),
                "landlock": self.req.landlock, "device_mode": self.req.device_mode}
        spec["card"]["cases"] = []
        return spec

    def launch(self) -> None:
        import torch.distributed as dist

        t0 = time.monotonic()
        spec = self.rank_spec()
        # The rendezvous store is served here, by the coordinator: no rank owns it, and it closes once every
        # rank's process group is connected, so ranks cannot use it as a channel.
        self.store = dist.TCPStore("127.0.0.1", 0, self.world, True, wait_for_workers=False,
                                   timeout=timedelta(seconds=self.timeout_s))
        spec["store_port"] = self.store.port
        if self.spawner is None:
            raise RuntimeError("an evaluation that runs candidate code needs a spawner (judge/coordinator/spawner.py)")
        for r in range(self.world):
            mine, theirs = socket.socketpair()
            try:
                pid = self.spawner.spawn("rank", theirs, rank=r, world=self.world, spec=spec,
                                         workdir=str(self.workdir))
            finally:
                theirs.close()
            mine.setblocking(False)
            self.ranks.append(RankProc(rank=r, pid=pid, sock=mine))
        self.timings.launch_s = time.monotonic() - t0

    def rendezvous(self) -> None:
        """Every rank reports its set-up (process group, confinement, rank 0's roofline) before candidate code
        exists; only these messages are taken for the isolation report and the roofline."""
        t0 = time.monotonic()
        msgs = self.gather(range(self.world), "setup")
        self.accept_setup(msgs)
        if self.req.device_mode != "cuda":  # NCCL may open communicators later; gloo is connected by now
            self.store = None
        self.timings.rendezvous_s = max(m[0].get("rendezvous_s", 0.0) for m in msgs.values()) if msgs else 0.0
        self.gather(range(self.world), "ready")
        self.timings.load_s = time.monotonic() - t0 - self.timings.rendezvous_s

    def accept_setup(self, msgs: dict[int, tuple[dict, bytes]]) -> None:
        """The isolation report (the weakest rank's) and the roofline, from the pre-candidate set-up messages."""
        reports = [m[0].get("isolation") or {} for _, m in sorted(msgs.items())]
        iso = dict(reports[0]) if reports else {}
        for rep in reports[1:]:
            for k, v in rep.items():
                if isinstance(v, bool) and not v:
                    iso[k] = False
                elif k == "landlock_abi":
                    iso[k] = min(int(iso.get(k, 0)), int(v))
        self.result.isolation = iso
        head = msgs[min(msgs)][0] if msgs else {}
        if isinstance(head.get("device"), dict):
            self.result.hardware["rank_device"] = head["device"]
        if head.get("roofline"):
            try:
                self.result.roofline = Roofline.model_validate(head["roofline"])
            except ValueError as exc:
                raise RankFailure(Verdict.runtime_error, f"rank 0 sent a malformed roofline: {exc}") from None

    # ---- messaging ---------------------------------------------------------------------------------------
    def send(self, rp: RankProc, header: dict[str, Any], blob: bytes = b"") -> None:
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

    def gather(self, ranks, expect: str, case: str | None = None, then=None) -> dict[int, Any]:
        """Wait for one message from each rank in `ranks`; fail with a verdict naming who crashed or hung.
        `then(rank, message)`, if given, sees each message at once and may name the next message that rank owes
        (a dialogue of several steps per rank, run for all ranks together); the last message is returned."""
        pending = set(ranks)
        waiting = {r: expect for r in pending}
        got: dict[int, Any] = {}
        sel = selectors.DefaultSelector()
        for r in pending:
            sel.register(self.ranks[r].sock, selectors.EVENT_READ, r)
        try:
            while pending:
                for r in list(pending):
                    msg = self.pop(r, case)
                    while msg is not None:
                        self.absorb(r, msg, waiting[r], case)
                        nxt = then(r, msg) if then else None
                        if not nxt:
                            got[r] = msg
                            pending.discard(r)
                            sel.unregister(self.ranks[r].sock)
                            break
                        waiting[r] = nxt
                        msg = self.pop(r, case)
                if not pending:
                    break
                left = self.deadline - time.monotonic()
                if left <= 0:
                    self.hang(sorted(pending), case)
                for key, _ in sel.select(timeout=min(left, 1.0)):
                    self.read_some(self.ranks[key.data], case)
        finally:
            sel.close()
        return got

    def pop(self, r: int, case: str | None) -> tuple[dict, bytes] | None:
        """The next whole frame from rank `r`, if one is buffered; a malformed or out-of-order frame is that rank's
        runtime error (its code can write anything on its channel)."""
        try:
            return self.ranks[r].reader.pop()
        except ProtocolError as exc:
            raise RankFailure.protocol(f"rank {r}", exc, case) from None

    def read_some(self, rp: RankProc, case: str | None) -> None:
        """Read what rank `rp` has sent; a channel closed with no whole frame left is a crash."""
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

    def absorb(self, r: int, msg: tuple[dict, bytes], expect: str, case: str | None) -> None:
        header = msg[0]
        rp = self.ranks[r]
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
        if kind != expect:
            raise RankFailure(Verdict.runtime_error, f"rank {r} sent {kind!r} where {expect!r} was expected", case)

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
            self.ranks[r].state = "hung"
            try:
                os.kill(self.ranks[r].pid, signal.SIGUSR1)  # faulthandler dumps the Python stacks
            except ProcessLookupError:
                pass
        time.sleep(0.3)
        raise RankFailure(Verdict.timeout, f"time limit of {self.timeout_s:g}s reached; rank(s) "
                          f"{', '.join(map(str, pending))} did not finish" + (f" case {case}" if case else ""), case)

    # ---- stage 3: correctness ------------------------------------------------------------------------
    def seed(self, *parts: object) -> int:
        return derive_seed(self.secret, *parts)

    def tolerance(self, case: CaseSpec) -> tuple[float, float]:
        tol = self.card.tolerance_for(case.dtype)
        return tol.rtol, tol.atol

    def decode(self, r: int, msg: tuple[dict, bytes], case: str | None) -> tuple[dict, dict]:
        """A rank's tensors as (outputs, the read-only inputs it sent back); a malformed message is its failure."""
        try:
            tensors = decode_tensors(msg[0].get("outputs"), msg[1])
        except ProtocolError as exc:
            raise RankFailure.protocol(f"rank {r}", exc, case) from None
        return split_inputs(tensors)

    def start_line(self, case: str | None) -> list[int]:
        """Wait until every rank has staged its inputs, then release them; returns each rank's release time (ns)."""
        self.gather(range(self.world), "staged", case)
        released = []
        for rp in self.ranks:
            released.append(time.perf_counter_ns())
            self.send(rp, {"cmd": "go"})
        return released

    def inputs_changed(self, case: CaseSpec, inputs: list[dict], shown: list[dict], detail: str = "",
                       sample_seed: int | None = None) -> Mismatch | None:
        """Whether a rank changed a read-only input: compared here, with the inputs regenerated from their seeds,
        to what the rank handed back after the call (whole, or sampled by `sample_together` with `sample_seed`,
        drawn after the call)."""
        if not self.card.rules.inputs_read_only:
            return None
        for r in range(self.world):
            mine = self.op.candidate_inputs(inputs[r])
            want = mine if sample_seed is None else sample_together(mine, sample_seed)
            for name in sorted(want):
                got = shown[r].get(name)
                if got is None or not _same(want[name].reshape(-1), got.reshape(-1)):
                    what = name if sample_seed is None else f"{name.split('#')[0]} inputs"
                    return Mismatch(case=case.name, rank=r, output=what, reason="input_mutated", hidden=not case.visible,
                                    detail=f"rank {r} modified its input {what!r}; inputs are read-only{detail}")
        return None

    def run_case(self, case: CaseSpec) -> CaseResult:
        t0 = time.monotonic()
        seeds = [self.seed("case", case.name, r) for r in range(self.world)]
        for rp in self.ranks:
            self.send(rp, {"cmd": "check", "case": case.model_dump(mode="json"), "seed": seeds[rp.rank]})
        self.start_line(case.name)
        msgs = self.gather(range(self.world), "result", case.name)
        decoded = [self.decode(r, msgs[r], case.name) for r in range(self.world)]
        outputs = [d[0] for d in decoded]
        t1 = time.monotonic()
        inputs = [self.op.make_inputs(case, r, self.world, seeds[r]) for r in range(self.world)]
        changed = self.inputs_changed(case, inputs, [d[1] for d in decoded])
        mm = None if changed else self.op.verify(case, self.world, inputs, outputs, self.tolerance(case))
        self.timings.verify_s += time.monotonic() - t1
        mismatch = changed or (Mismatch(hidden=not case.visible, **mm) if mm else None)
        return CaseResult(name=case.name, visible=case.visible, passed=mismatch is None,
                          seconds=t1 - t0, mismatch=mismatch)

    def check(self) -> None:
        t0 = time.monotonic()
        cases = [c for c in self.card.cases if self.op.supports_world(self.world, c)]
        if not cases:
            raise RankFailure(Verdict.infra_error, f"no case of {self.card.id} applies at world size {self.world}")
        cases.sort(key=lambda c: not c.visible)
        for case in cases:
            self.result.cases.append(self.run_case(case))
        self.timings.run_s += time.monotonic() - t0 - self.timings.verify_s

    # ---- stage 4: benchmark --------------------------------------------------------------------------
    def benchmark(self) -> None:
        perf = self.card.performance.for_device(self.req.device_mode)
        t0 = time.monotonic()
        verify_before = self.timings.verify_s
        for size in perf.sizes_for(self.req.device_mode):
            self.result.benchmark.append(self.bench_size(perf, size))
        self.timings.run_s += time.monotonic() - t0 - (self.timings.verify_s - verify_before)

    def bench_size(self, perf, size: int) -> SizeResult:
        case = self.op.size_case(perf, size, self.world)
        n_iter = perf.warmup + perf.iters
        seeds = [[self.seed("bench", size, it, r) for it in range(n_iter)] for r in range(self.world)]
        full = type(self.op).verify is not GoldenOp.verify
        for rp in self.ranks:
            self.send(rp, {"cmd": "bench", "case": case.model_dump(mode="json"), "calls": n_iter,
                           "full_outputs": full})
        if self.req.device_mode == "cpu":
            times, samples, extended, bounded = self.bench_released(case, size, perf, seeds)
        else:
            times, samples, extended, bounded = self.bench_back_to_back(case, size, perf, seeds)
        t1 = time.monotonic()
        mismatch = self.verify_samples(case, size, seeds, samples, full)
        self.timings.verify_s += time.monotonic() - t1
        return self.size_result(case, size, perf, times, mismatch).model_copy(
            update={"extended_calls": extended, "clock_bounded": bounded})

    def bench_released(self, case: CaseSpec, size: int, perf, seeds) -> tuple:
        """CPU: one call at a time. Each call's seed reaches the ranks only once the previous call's samples are
        in; the coordinator releases all ranks together and times each from its release to the arrival of its
        samples, which it asks for only once the rank says the call returned. So the time covers all the work the
        outputs depend on, and nothing a rank reports about itself is taken as a time."""
        times = [[0.0] * perf.iters for _ in range(self.world)]
        samples: list[tuple[int, int, tuple]] = []
        for it in range(perf.warmup + perf.iters):
            timed = it >= perf.warmup
            for rp in self.ranks:
                self.send(rp, {"seed": seeds[rp.rank][it], "it": it, "sample": timed})
            released = self.start_line(case.name)
            ends = [0] * self.world
            ask = self.sample_ask(size, it)

            def then(r: int, msg: tuple[dict, bytes]) -> str | None:
                if msg[0].get("type") == "done":
                    if not timed:
                        return None
                    self.send(self.ranks[r], ask)
                    return "samples"
                ends[r] = time.perf_counter_ns()
                return None

            got = self.gather(range(self.world), "done", case.name, then=then)
            if timed:
                for r in range(self.world):
                    times[r][it - perf.warmup] = (ends[r] - released[r]) / 1e3
                    samples.append((it, r, self.decode(r, got[r], case.name)))
        return times, samples, 0, False

    def bench_back_to_back(self, case: CaseSpec, size: int, perf, seeds) -> tuple:
        """GPU: the warm-up calls, then the timed calls, each phase back-to-back on inputs staged just before it
        (so no warm-up call sees a timed call's inputs). The ranks' CUDA events time each call; the coordinator's
        own clock around the timed phase bounds them from below (a rank's events summing to less than that window
        less the start line's slack are raised to it), since events are read inside the candidate's process."""
        warm = perf.warmup
        for rp in self.ranks:
            self.send(rp, {"seeds": seeds[rp.rank][:warm]})
        if warm:
            self.start_line(case.name)
            self.gather(range(self.world), "calls", case.name)
        for rp in self.ranks:
            self.send(rp, {"seeds": seeds[rp.rank][warm:], "first": warm})
        released = self.start_line(case.name)
        ends = [0] * self.world

        def arrived(r: int, msg: tuple[dict, bytes]) -> None:
            ends[r] = time.perf_counter_ns()

        msgs = self.gather(range(self.world), "calls", case.name, then=arrived)
        times, bounded, extended = [], False, 0
        for r in range(self.world):
            ns, raised = self.bounded_times(f"rank {r}", msgs[r][0].get("ns"), perf.iters, ends[r] - released[r],
                                            case.name)
            times.append([x / 1e3 for x in ns])
            bounded = bounded or raised
            extended = max(extended, perf.iters if msgs[r][0].get("extended") else 0)
        samples = []
        for i in range(perf.iters):
            it = warm + i
            ask = self.sample_ask(size, it)
            for rp in self.ranks:
                self.send(rp, ask)
            got = self.gather(range(self.world), "samples", case.name)
            for r in range(self.world):
                samples.append((it, r, self.decode(r, got[r], case.name)))
        return times, samples, extended, bounded

    def sample_ask(self, size: int, it: int) -> dict[str, int]:
        """The seeds of the positions sampled after timed call `it`: of its outputs, and of its read-only inputs."""
        return {"sample_seed": self.seed("sample", size, it), "input_seed": self.seed("sample-in", size, it)}

    @staticmethod
    def bounded_times(who: str, ns: Any, calls: int, window_ns: int, case: str) -> tuple[list[int], bool]:
        """A process's own GPU timings of `calls` calls, checked and raised (proportionally) to `clock_floor` of the
        coordinator's window around them if they sum to less; returns them and whether they were raised."""
        if not isinstance(ns, list) or len(ns) != calls or not all(type(x) is int and x >= 0 for x in ns):
            raise RankFailure.protocol(who, "bad call times", case)
        floor, total = clock_floor(window_ns), sum(ns)
        if total >= floor:
            return ns, False
        return ([int(x * floor / total) for x in ns] if total else [floor // calls] * calls), True

    def calls_released_singly(self) -> bool:
        """Whether each timed call's inputs reach the ranks only once the previous call is over (then a call can
        see no later call's inputs, and the median iteration is safe to score), or calls run back-to-back."""
        return self.req.device_mode == "cpu"

    def size_result(self, case: CaseSpec, size: int, perf, times: list[list[float]],
                    mismatch: Mismatch | None) -> SizeResult:
        """nccl-tests statistics from times[rank][iteration] in microseconds."""
        per_rank_mean = [sum(t) / len(t) for t in times]
        per_iter_max = [max(times[r][i] for r in range(self.world)) for i in range(perf.iters)]
        t_us = max(per_rank_mean)  # nccl-tests: average over iterations, max over ranks
        nbytes = self.op.metric_bytes(case, self.world)
        algbw = nbytes / (t_us * 1e-6) / 1e9 if t_us > 0 else 0.0
        flops = self.op.flops(case, self.world)
        busbw = algbw * busbw_factor(self.op.nccl_op, self.world)
        roof = self.result.roofline
        shown = algbw if self.card.performance.metric == "algbw" else busbw
        roof_gbps = roof.per_rank_gbps if roof and roof.per_rank_gbps > 0 else None
        if roof_gbps and roof.emulated and self.card.performance.metric == "busbw":
            roof_gbps *= bus_share_of_copy(self.op.nccl_op, self.world)
        pct = 100 * shown / roof_gbps if roof_gbps and shown > 0 else None
        if mismatch is None and self.card.performance.metric in ("busbw", "algbw"):
            why = implausible_timing(pct, size, roof.name if roof else "")
            if why:
                fastest = min(range(self.world), key=lambda r: per_rank_mean[r])
                mismatch = Mismatch(case=case.name, rank=fastest, output="", reason="timing", detail=why)
        return SizeResult(size_bytes=size, dtype=case.dtype, count=int(case.shape[0]) if case.shape else 0,
                          iters=perf.iters, warmup=perf.warmup, time_us=t_us,
                          time_us_median=statistics.median(per_iter_max), time_us_min=min(per_iter_max),
                          time_us_scored=(statistics.median(per_iter_max) if self.calls_released_singly()
                                          else statistics.fmean(per_iter_max)),
                          per_rank_mean_us=per_rank_mean, algbw_gbps=algbw,
                          busbw_gbps=busbw, roofline_gbps=roof_gbps, roofline_pct=pct,
                          tflops=flops / (t_us * 1e-6) / 1e12 if flops and t_us > 0 else 0.0,
                          verified=mismatch is None, mismatch=mismatch)

    def verify_samples(self, case: CaseSpec, size: int, seeds, samples, full: bool) -> Mismatch | None:
        """Check every timed iteration's outputs (or samples of them); the first mismatch by iteration, or None.

        Iterations are independent (each has its own inputs to regenerate), so they are checked on a thread pool:
        with nccl-tests' 20 timed calls, regenerating inputs dominated a GPU evaluation's wall time."""
        by_iter: dict[int, dict[int, dict]] = {}
        for it, r, outs in samples:
            by_iter.setdefault(it, {})[r] = outs
        items = sorted(by_iter.items())
        workers = max(1, min(len(items), VERIFY_THREADS, usable_cores()))
        with ThreadPoolExecutor(workers, thread_name_prefix="verify") as pool:
            found = list(pool.map(lambda item: self.verify_iteration(case, size, seeds, *item, full), items))
        return next((m for m in found if m is not None), None)

    def verify_iteration(self, case: CaseSpec, size: int, seeds, it: int, handed: dict[int, tuple[dict, dict]],
                         full: bool) -> Mismatch | None:
        tol = self.tolerance(case)
        inputs = [self.op.make_inputs(case, r, self.world, seeds[r][it]) for r in range(self.world)]
        per_rank = {r: handed[r][0] for r in handed}
        shown = [handed[r][1] for r in range(self.world)]
        changed = self.inputs_changed(case, inputs, shown, f" (timed iteration {it})",
                                      None if full else self.sample_ask(size, it)["input_seed"])
        if changed:
            return changed
        if full:
            mm = self.op.verify(case, self.world, inputs, [per_rank[r] for r in range(self.world)], tol)
            if mm:
                mm["detail"] = (mm.get("detail", "") + f" (timed iteration {it})").strip()
                return Mismatch(**mm)
            return None
        for r, outputs in enumerate(self.sampled_expectation(case, size, it, inputs)):
            for name, (numel, idx, exp) in sorted(outputs.items()):
                got = per_rank[r].get(name)
                got_numel = per_rank[r].get(name + "#numel")
                if got is None or got_numel is None or int(got_numel[0]) != numel:
                    return Mismatch(case=case.name, rank=r, output=name, reason="shape",
                                    detail=f"timed iteration {it}: output {name!r} has the wrong size")
                if numel == 0:
                    continue
                m = compare_tensor(exp, got, tol)
                if m:
                    pos = int(idx[m["index"][0]]) if m.get("index") else 0
                    m["index"] = [pos]
                    m.pop("wrong_count", None), m.pop("total_count", None)
                    return Mismatch(case=case.name, rank=r, output=name,
                                    detail=f"timed iteration {it} (sampled check)", **m)
        return None

    def sampled_expectation(self, case: CaseSpec, size: int, it: int, inputs: list[dict]) -> list[dict]:
        """Per rank: output name -> (numel, the flat positions the rank sampled, the expected values there).

        Positions are drawn as the rank drew them: one generator per rank from the iteration's sample seed, outputs
        in sorted name order, nothing drawn for an empty output. Ops that can compute their outputs at a few
        positions (`GoldenOp.expected_samples`) skip the full expected outputs, which cost more than making the
        inputs again (0.2 s per 64 MiB all-reduce iteration, 2 s for the fused RMSNorm)."""
        import torch

        gens = [torch.Generator().manual_seed(self.seed("sample", size, it)) for _ in range(self.world)]
        drawn: list[dict] = [{} for _ in range(self.world)]

        def pick(rank: int, name: str, numel: int):
            idx = sample_positions(numel, gens[rank])
            drawn[rank][name] = (numel, idx)
            return idx

        values = self.op.expected_samples(case, self.world, inputs, pick)
        if values is None:
            values = [{name: exp.reshape(-1)[pick(r, name, exp.numel())] for name, exp in sorted(outs.items())}
                      for r, outs in enumerate(self.op.expected(case, self.world, inputs))]
        return [{name: (*drawn[r][name], v) for name, v in values[r].items()} for r in range(self.world)]

    # ---- stage 5: profile ----------------------------------------------------------------------------
    def profile(self) -> None:
        vis = self.card.visible_cases()
        case = max(vis, key=lambda c: self.op.metric_bytes(c, self.world))
        seed = self.seed("profile", case.name)
        for rp in self.ranks:
            self.send(rp, {"cmd": "profile", "case": case.model_dump(mode="json"), "seed": seed + rp.rank * 7919})
        msgs = self.gather(range(self.world), "profile", case.name)
        for r in range(self.world):
            h = msgs[r][0]
            rows = kernel_bandwidth(h["rows"], self.op.metric_bytes(case, self.world), gpu_rows_only=True)
            self.result.profile.append(RankProfile(rank=r, case=case.name, wall_us=h["wall_us"], comm_us=h["comm_us"],
                                                   compute_us=h["compute_us"], rows=rows))

    # ---- stage 6: shutdown -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        for rp in self.ranks:
            if rp.state == "ok":
                try:
                    rp.sock.setblocking(True)
                    rp.sock.settimeout(0.2)
                    rp.sock.sendall(pack({"cmd": "exit"}, b"", rp.sent))
                except OSError:
                    pass
        end = time.monotonic() + 1.0
        for rp in self.ranks:
            if rp.state == "ok":
                self.reap(rp, wait=max(0.0, end - time.monotonic()))
                if rp.exit_code == 0:
                    rp.state = "ok"  # asked to exit, and did
        for rp in self.ranks:
            if rp.exit_code is None and rp.signal is None:
                try:
                    os.killpg(rp.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    os.kill(rp.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                was = rp.state
                self.reap(rp, wait=2.0)
                if was in ("hung",):
                    rp.state = "hung"
                elif was == "ok":
                    rp.state = "killed"
            else:
                try:  # anything the rank left behind in its session goes too
                    os.killpg(rp.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            rp.sock.close()

    def collect_ranks(self) -> None:
        limit = self.req.max_output_chars
        for rp in self.ranks:
            rdir = self.workdir / f"rank{rp.rank}"
            state = rp.state
            if state == "exited_early" and rp.exit_code == 0 and self.result.verdict == Verdict.passed:
                state = "ok"
            self.result.ranks.append(RankStatus(
                rank=rp.rank, state=state, exit_code=rp.exit_code, signal=rp.signal,
                stdout=_tail(rdir / "stdout.txt", limit), stderr=_tail(rdir / "stderr.txt", limit),
                stack=_tail(rdir / "stack.txt", limit) if rp.state == "hung" else None))
            for v in rp.violations:
                vv = Violation(rank=rp.rank, **{k: v[k] for k in ("rule", "detail", "where") if k in v})
                if vv not in self.result.violations:
                    self.result.violations.append(vv)

    # ---- the whole evaluation ---------------------------------------------------------------------------
    def run(self) -> JudgeResult:
        mode = self.req.mode
        try:
            if not self.static_check():
                return self.finish()
            if mode == "compile":
                self.result.verdict = Verdict.compiled
                self.result.summary = "compiled: syntax, imports and rules are fine (nothing was run)"
                return self.finish()
            if self.req.device_mode not in [m.value for m in self.card.world.device_modes]:
                self.result.verdict = Verdict.infra_error
                self.result.summary = (f"{self.card.id} does not run in device mode {self.req.device_mode!r}; "
                                       f"it declares {[m.value for m in self.card.world.device_modes]}")
                return self.finish()
            if self.world not in self.card.world.sizes:
                self.result.verdict = Verdict.infra_error
                self.result.summary = f"{self.card.id} runs at world sizes {self.card.world.sizes}, not {self.world}"
                return self.finish()
            self.run_mode()
        except RankFailure as f:
            self.result.verdict = f.verdict
            self.result.summary = f.summary
            if f.case:
                names = {c.name for c in self.result.cases}
                if f.case not in names:
                    case = next((c for c in self.card.cases if c.name == f.case), None)
                    self.result.cases.append(CaseResult(name=f.case, visible=case.visible if case else False,
                                                        passed=False, error=f.summary))
        finally:
            if self.ranks:
                self.shutdown()
                self.collect_ranks()
        return self.finish()

    def run_mode(self) -> None:
        """Launch the ranks and run the stages the mode asks for."""
        mode = self.req.mode
        if mode == "sanitize":
            raise RankFailure(Verdict.infra_error, "sanitize runs compute-sanitizer on cuda tasks; this task is "
                                                   f"written in {self.card.language.value}")
        self.launch()
        self.rendezvous()
        if mode in ("check", "full"):
            self.check()
        if mode == "benchmark" or (mode == "full" and all(c.passed for c in self.result.cases)):
            self.benchmark()
        if mode == "profile":
            self.profile()

    def grade_isolation(self) -> None:
        """Name the kernel layers the trust model needs that the ranks could not apply (only where they ran)."""
        iso = self.result.isolation
        if not iso:
            return
        missing = []
        if not iso.get("seccomp"):
            missing.append("seccomp" + (f" ({iso['seccomp_error']})" if iso.get("seccomp_error") else ""))
        if not iso.get("landlock_abi"):
            missing.append("landlock" if self.req.landlock else "landlock (switched off by the request)")
        self.result.isolation_missing = missing
        self.result.leaderboard_grade = not missing or self.req.accept_weak_isolation

    def finish(self) -> JudgeResult:
        self.grade_isolation()
        r = self.result
        if r.violations and r.verdict in (Verdict.passed, Verdict.wrong_answer, Verdict.runtime_error):
            r.verdict = Verdict.forbidden
            r.summary = f"rule broken at run time: {r.violations[0].detail}"
        elif r.verdict == Verdict.passed:
            failed = [c for c in r.cases if not c.passed]
            bad_bench = [s for s in r.benchmark if not s.verified]
            if failed:
                r.verdict = Verdict.wrong_answer
                r.summary = f"{len(r.cases) - len(failed)}/{len(r.cases)} cases passed"
            elif bad_bench:
                r.verdict = Verdict.wrong_answer
                r.summary = f"wrong output in a timed iteration at size {bad_bench[0].size_bytes} B"
            else:
                parts = []
                if r.cases:
                    parts.append(f"all {len(r.cases)} cases passed")
                if r.benchmark:
                    parts.append(f"benchmarked {len(r.benchmark)} sizes")
                if r.profile:
                    parts.append(f"profiled {len(r.profile)} ranks")
                r.summary = "; ".join(parts) or "ok"
        if self.req.cleanup:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.timings.total_s = time.monotonic() - self.t_start
        r.timings = self.timings
        return r


def _same(a, b) -> bool:
    """Equal in shape, dtype and every value (NaN equal to NaN)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a, b)) or (a.is_floating_point() and bool(torch.equal(a.isnan(), b.isnan()))
                                       and bool(torch.equal(a.nan_to_num(), b.nan_to_num())))


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


def evaluate(req: JudgeRequest, spawner: "Spawner") -> JudgeResult:
    """Run one evaluation to completion. Must be called in a process that will not run candidate code; every
    candidate process comes from `spawner`, forked before this process read the request."""
    if req.task["card"].get("language") == "cuda":
        from .cuda_eval import DeviceHostEvaluation

        return DeviceHostEvaluation(req, spawner).run()
    return Evaluation(req, spawner).run()
