"""Evaluation of `cuda` tasks: the same stages as torch tasks, but one device-host process runs every rank.

Only launching and the per-call messages differ; verification, timing statistics, verdicts and clean-up are the
coordinator's, shared with torch tasks.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from ...cards import CaseSpec
from .evaluation import Evaluation, RankFailure, RankProc
from ..protocol import Channel, ProtocolError, decode_tensors, split_inputs
from ..host.result import (CaseResult, Mismatch, RankProfile, SanitizerReport, SizeResult, Verdict,
                     kernel_bandwidth)


def _split(flat: dict[str, Any], world: int) -> list[dict[str, Any]]:
    per = [dict() for _ in range(world)]
    for key, t in flat.items():
        r, _, name = key.partition("/")
        per[int(r)][name] = t
    return per


class DeviceHostEvaluation(Evaluation):
    def host_spec(self, timeout_s: float) -> dict[str, Any]:
        """What a device host is started with: the card without its cases (hidden shapes stay here)."""
        spec = {"card": self.card.model_dump(mode="json"), "timeout_s": timeout_s, "landlock": self.req.landlock,
                "device_mode": self.req.device_mode}
        spec["card"]["cases"] = []
        return spec

    def launch(self) -> None:
        t0 = time.monotonic()
        if self.spawner is None:
            raise RuntimeError("an evaluation that runs candidate code needs a spawner (judge/coordinator/spawner.py)")
        mine, theirs = socket.socketpair()
        try:
            pid = self.spawner.spawn("device_host", theirs, world=self.world, spec=self.host_spec(self.timeout_s),
                                     workdir=str(self.workdir), library=str(self.library))
        finally:
            theirs.close()
        mine.setblocking(False)
        self.ranks.append(RankProc(rank=0, pid=pid, sock=mine))
        self.timings.launch_s = time.monotonic() - t0

    def rendezvous(self) -> None:
        t0 = time.monotonic()
        self.accept_setup(self.gather([0], "setup"))
        self.gather([0], "ready")
        self.timings.load_s = time.monotonic() - t0

    def calls_released_singly(self) -> bool:
        return True  # flag protocols assume the previous call finished: each call's seeds come when it is due

    def split(self, msg: tuple[dict, bytes], case: str) -> list[tuple[dict, dict]]:
        """The device host's one message as (outputs, read-only inputs handed back) per rank."""
        try:
            flat = decode_tensors(msg[0].get("outputs"), msg[1])
            per = _split(flat, self.world)
        except (ProtocolError, ValueError, IndexError) as exc:
            raise RankFailure.protocol("the device host", exc, case) from None
        return [split_inputs(d) for d in per]

    def absorb(self, r: int, msg: tuple[dict, bytes], expect: str, case: str | None) -> None:
        if msg[0].get("type") == "hung":
            raise RankFailure(Verdict.timeout, f"time limit of {self.timeout_s:g}s reached; " + str(msg[0].get("error", ""))
                              + (f" (case {case})" if case else ""), case)
        super().absorb(r, msg, expect, case)

    def out_specs(self, case: CaseSpec, inputs: list[dict]) -> tuple[list[dict], list[dict]]:
        expected = self.op.expected(case, self.world, inputs)
        specs = []
        for exp in expected:
            d = {}
            for name, t in exp.items():
                dtype = case.dtype if t.is_floating_point() else str(t.dtype).removeprefix("torch.")
                d[name] = {"shape": list(t.shape), "dtype": dtype}
            specs.append(d)
        return specs, expected

    def run_case(self, case: CaseSpec) -> CaseResult:
        t0 = time.monotonic()
        seeds = [self.seed("case", case.name, r) for r in range(self.world)]
        inputs = [self.op.make_inputs(case, r, self.world, seeds[r]) for r in range(self.world)]
        specs, _ = self.out_specs(case, inputs)
        self.send(self.ranks[0], {"cmd": "check", "case": case.model_dump(mode="json"), "seeds": seeds,
                                  "out_specs": specs})
        self.gather([0], "staged", case.name)
        self.send(self.ranks[0], {"cmd": "go"})
        per = self.split(self.gather([0], "result", case.name)[0], case.name)
        t1 = time.monotonic()
        changed = self.inputs_changed(case, inputs, [p[1] for p in per])
        mm = None if changed else self.op.verify(case, self.world, inputs, [p[0] for p in per], self.tolerance(case))
        self.timings.verify_s += time.monotonic() - t1
        mismatch = changed or (Mismatch(hidden=not case.visible, **mm) if mm else None)
        return CaseResult(name=case.name, visible=case.visible, passed=mismatch is None, seconds=t1 - t0,
                          mismatch=mismatch)

    def bench_size(self, perf, size: int) -> SizeResult:
        """One call at a time: each call's seeds reach the device host only when it is due. The device host's
        CUDA events time each rank; the coordinator's clock around each call bounds them from below."""
        case = self.op.size_case(perf, size, self.world)
        n_iter = perf.warmup + perf.iters
        seeds = [[self.seed("bench", size, it, r) for it in range(n_iter)] for r in range(self.world)]
        specs, _ = self.out_specs(case, [self.op.make_inputs(case, r, self.world, seeds[r][0]) for r in range(self.world)])
        host = self.ranks[0]
        self.send(host, {"cmd": "bench", "case": case.model_dump(mode="json"), "calls": n_iter, "out_specs": specs})
        times = [[0.0] * perf.iters for _ in range(self.world)]
        samples: list[tuple[int, int, tuple]] = []
        extended, bounded = 0, False
        for it in range(n_iter):
            timed = it >= perf.warmup
            self.send(host, {"seeds": [seeds[r][it] for r in range(self.world)], "sample": timed})
            self.gather([0], "staged", case.name)
            t0 = time.perf_counter_ns()
            self.send(host, {"cmd": "go"})
            header, _ = self.gather([0], "done", case.name)[0]
            window = time.perf_counter_ns() - t0
            if not timed:
                continue
            ns = header.get("ns")
            if not isinstance(ns, list) or len(ns) != self.world:
                raise RankFailure.protocol("the device host", "bad call times", case.name)
            extended += bool(header.get("extended"))
            for r in range(self.world):  # each rank's one call, bounded by the window around all of them
                (t,), raised = self.bounded_times("the device host", ns[r:r + 1], 1, window, case.name)
                bounded = bounded or raised
                times[r][it - perf.warmup] = t / 1e3
            self.send(host, self.sample_ask(size, it))
            for r, handed in enumerate(self.split(self.gather([0], "samples", case.name)[0], case.name)):
                samples.append((it, r, handed))
        t1 = time.monotonic()
        # sampled positions are checked against op.expected (ops with a custom verify must keep expected too)
        mismatch = self.verify_samples(case, size, seeds, samples, False)
        self.timings.verify_s += time.monotonic() - t1
        return self.size_result(case, size, perf, times, mismatch).model_copy(
            update={"extended_calls": extended, "clock_bounded": bounded})

    def profile(self) -> None:
        """GPU kernels of one call, per rank where the device host could tell the ranks' kernels apart, else one
        table of all ranks' kernels (they run in one process) given with rank 0."""
        vis = self.card.visible_cases()
        case = max(vis, key=lambda c: self.op.metric_bytes(c, self.world))
        seeds = [self.seed("profile", case.name, r) for r in range(self.world)]
        specs, _ = self.out_specs(case, [self.op.make_inputs(case, r, self.world, seeds[r]) for r in range(self.world)])
        self.send(self.ranks[0], {"cmd": "profile", "case": case.model_dump(mode="json"), "seeds": seeds,
                                  "out_specs": specs})
        h, _ = self.gather([0], "profile", case.name)[0]
        op_bytes = self.op.metric_bytes(case, self.world)
        by_rank = h.get("rows_by_rank")
        for r in range(self.world):
            wall = h["ns"][r] / 1e3
            mine = by_rank[r] if by_rank else h["rows"] if r == 0 else []
            rows = kernel_bandwidth(mine, op_bytes, gpu_rows_only=False)
            comm = sum(x["total_us"] for x in rows if x["kind"] == "comm")
            self.result.profile.append(RankProfile(rank=r, case=case.name, wall_us=wall, comm_us=comm,
                                                   compute_us=max(0.0, wall - comm), rows=rows,
                                                   rows_of_all_ranks=not by_rank and r == 0,
                                                   rows_of_own_kernels=bool(by_rank)))
        if h["rows"]:
            self.result.ncu = self.ncu_summary(case, seeds, specs, h["rows"][0]["name"])

    # ---- sanitize: compute-sanitizer on the smallest visible case --------------------------------------------
    SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")

    def sanitize(self) -> None:
        exe = shutil.which("compute-sanitizer")
        if not exe:
            raise RankFailure(Verdict.infra_error, "compute-sanitizer is not installed in this sandbox")
        case = min(self.card.visible_cases(), key=lambda c: self.op.metric_bytes(c, self.world))
        seeds = [self.seed("sanitize", case.name, r) for r in range(self.world)]
        specs, _ = self.out_specs(case, [self.op.make_inputs(case, r, self.world, seeds[r]) for r in range(self.world)])
        spec = self.host_spec(self.timeout_s)
        for tool in self.SANITIZER_TOOLS:
            left = self.deadline - time.monotonic()
            if left < 5:
                self.result.sanitizer.append(SanitizerReport(tool=tool, status="skipped", report="no time left"))
                continue
            self.result.sanitizer.append(self._sanitize_one(exe, tool, case, seeds, specs, spec, left))

    def _sanitize_one(self, exe, tool, case, seeds, specs, spec, left: float) -> SanitizerReport:
        cmd = [exe, "--tool", tool, "--print-limit", "20", "--error-exitcode", "0"]
        if tool == "memcheck":  # a guard zone after every allocation: an overrun then hits no neighbouring buffer
            cmd += ["--padding", "512"]
        status, text = self._run_host_under(cmd, case, seeds, specs, spec, left)
        m = re.search(r"ERROR SUMMARY:\s*(\d+)", text) or re.search(r"RACECHECK SUMMARY:.*?\((\d+) errors?", text)
        errors = int(m.group(1)) if m else None
        findings = [ln for ln in text.splitlines() if ln.startswith("=========")]
        report = "\n".join(findings[:80]) or text[-3000:]
        return SanitizerReport(tool=tool, status=status, errors=errors, report=report)

    def _run_host_under(self, tool_cmd: list[str], case, seeds, specs, spec, left: float) -> tuple[str, str]:
        """One `check` call of every rank in a fresh device host run under an external tool: (status, output)."""
        mine, theirs = socket.socketpair()
        cmd = [*tool_cmd, sys.executable, "-m", "commbench_env.judge.candidate.device_host", "--fd", str(theirs.fileno()),
               "--workdir", str(self.workdir)]
        # one cudaMalloc per tensor: inside the caching allocator's big blocks an overrun is invisible to memcheck
        env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
        proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=self.workdir, env=env)
        theirs.close()
        status = "ok"
        end = time.monotonic() + left
        try:
            mine.settimeout(left)
            ch = Channel(mine)
            ch.send({"world": self.world, "spec": spec, "library": self.library})
            header, _ = ch.recv()
            if header.get("type") == "setup":
                header, _ = ch.recv()
            if header.get("type") != "ready":
                status = f"did not start: {header.get('error', header.get('type'))}"
            else:
                ch.send({"cmd": "check", "case": case.model_dump(mode="json"), "seeds": seeds, "out_specs": specs})
                header, _ = ch.recv()
                if header.get("type") == "staged":
                    ch.send({"cmd": "go"})
                    header, _ = ch.recv()
                if header.get("type") in ("error", "hung"):
                    status = f"the call failed: {header.get('error', '')}"
                ch.send({"cmd": "exit"})
            out, _ = proc.communicate(timeout=max(1.0, end - time.monotonic()))
        except (OSError, EOFError, ValueError, subprocess.TimeoutExpired, socket.timeout):
            status = "time limit reached"
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, _ = proc.communicate()
        finally:
            mine.close()
        return status, out.decode(errors="replace")

    # ---- ncu: Nsight Compute on the slowest kernel of the profiled call ----------------------------------------
    NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "WarpStateStats")
    NCU_METRICS = ("Duration", "DRAM Throughput", "Memory Throughput", "L1/TEX Cache Throughput",
                   "L2 Cache Throughput", "Compute (SM) Throughput", "Achieved Occupancy", "Theoretical Occupancy",
                   "Warp Cycles Per Issued Instruction", "Registers Per Thread", "Block Size", "Grid Size")
    NCU_LIMIT_S = 90.0

    def ncu_summary(self, case, seeds, specs, kernel: str) -> SanitizerReport:
        exe = shutil.which("ncu")
        if not exe:
            return SanitizerReport(tool="ncu", status="not installed in this sandbox",
                                   report="Nsight Compute (ncu) is not on PATH here; the kernel table still holds")
        left = min(self.NCU_LIMIT_S, self.deadline - time.monotonic() - 2)
        if left < 5:
            return SanitizerReport(tool="ncu", status="skipped", report="no time left in this evaluation")
        name = kernel_base_name(kernel)
        spec = self.host_spec(left)
        cmd = [exe, "--target-processes", "all", "--launch-count", "1", "-k", f"regex:^{re.escape(name)}$"]
        for sec in self.NCU_SECTIONS:
            cmd += ["--section", sec]
        status, text = self._run_host_under(cmd, case, seeds, specs, spec, left)
        if status == "time limit reached":
            return SanitizerReport(tool="ncu", status=status, report=(
                "ncu replays one kernel at a time, so kernels that wait for other ranks' flags never finish under "
                "it; the kernel table above still holds"))
        return SanitizerReport(tool="ncu", status=status, report=summarise_ncu(text, self.NCU_METRICS) or text[-2000:])

    def run_mode(self) -> None:
        if self.req.mode == "sanitize":
            self.sanitize()
            bad = [s for s in self.result.sanitizer if s.errors]
            if bad:
                self.result.verdict = Verdict.runtime_error
                self.result.summary = "; ".join(f"{s.tool}: {s.errors} error(s)" for s in bad)
            else:
                self.result.summary = "; ".join(f"{s.tool}: {s.errors if s.errors is not None else '?'} error(s), {s.status}"
                                                for s in self.result.sanitizer)
        else:
            super().run_mode()


def kernel_base_name(name: str) -> str:
    """'void (anonymous namespace)::pull_kernel<16>(char*, long)' -> 'pull_kernel' (what `ncu -k` matches)."""
    name = name.replace("(anonymous namespace)::", "").removeprefix("[gpu] ")
    m = re.search(r"(\w+)\s*(?:<.*?>)?\s*\(", name)
    return m.group(1) if m else name.split("(")[0].split("::")[-1].strip()


def summarise_ncu(text: str, metrics: tuple[str, ...]) -> str:
    """The kernel line, the chosen metrics and the first rule findings of an ncu details page."""
    keep: list[str] = []
    rules = stalls = 0
    for ln in text.splitlines():
        s = ln.strip()
        if not s or s.startswith("==PROF=="):
            continue
        if "Context" in s and "Device" in s and "(" in s:
            keep.append(s[:160])
        elif any(s.startswith(m + " ") for m in metrics):
            keep.append("  " + " ".join(s.split()))
        elif s.startswith(("OPT", "WRN")) and rules < 4:
            rules += 1
            keep.append("  " + " ".join(s.split())[:240])
        elif "being stalled" in s and stalls < 2:  # the warp-state rules' sentences name the top stall reasons
            stalls += 1
            keep.append("  " + " ".join(s.split())[:240])
    return "\n".join(keep)
