"""External CUDA tools on a `cuda` candidate: compute-sanitizer (mode `sanitize`) and Nsight Compute (with a
profile). Each runs one `check` call of every rank in a fresh device host started under the tool, seeds and
output shapes sent from here as for any call."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

from ...cards import CaseSpec
from ..host.result import SanitizerReport, Verdict
from ..protocol import Channel
from .host_specs import host_spec, specs_for
from .links import RankFailure

SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "WarpStateStats")
NCU_METRICS = ("Duration", "DRAM Throughput", "Memory Throughput", "L1/TEX Cache Throughput",
               "L2 Cache Throughput", "Compute (SM) Throughput", "Achieved Occupancy", "Theoretical Occupancy",
               "Warp Cycles Per Issued Instruction", "Registers Per Thread", "Block Size", "Grid Size")
NCU_LIMIT_S = 90.0


def sanitize(ev) -> list[SanitizerReport]:
    """compute-sanitizer's memcheck, racecheck and synccheck on the smallest visible case."""
    exe = shutil.which("compute-sanitizer")
    if not exe:
        raise RankFailure(Verdict.infra_error, "compute-sanitizer is not installed in this sandbox")
    case = min(ev.card.visible_cases(), key=lambda c: ev.op.metric_bytes(c, ev.world))
    seeds = [ev.seed("sanitize", case.name, r) for r in range(ev.world)]
    specs = specs_for(ev, case, seeds)
    reports = []
    for tool in SANITIZER_TOOLS:
        left = ev.deadline - time.monotonic()
        if left < 5:
            reports.append(SanitizerReport(tool=tool, status="skipped", report="no time left"))
            continue
        cmd = [exe, "--tool", tool, "--print-limit", "20", "--error-exitcode", "0"]
        if tool == "memcheck":  # a guard zone after every allocation: an overrun then hits no neighbouring buffer
            cmd += ["--padding", "512"]
        status, text = run_host_under(ev, cmd, case, seeds, specs, left)
        m = re.search(r"ERROR SUMMARY:\s*(\d+)", text) or re.search(r"RACECHECK SUMMARY:.*?\((\d+) errors?", text)
        findings = [ln for ln in text.splitlines() if ln.startswith("=========")]
        reports.append(SanitizerReport(tool=tool, status=status, errors=int(m.group(1)) if m else None,
                                       report="\n".join(findings[:80]) or text[-3000:]))
    return reports


def ncu_summary(ev, case: CaseSpec, seeds: list[int], specs: list[dict], kernel: str) -> SanitizerReport:
    """Nsight Compute's speed-of-light, occupancy and warp-state sections for one kernel of one call."""
    exe = shutil.which("ncu")
    if not exe:
        return SanitizerReport(tool="ncu", status="not installed in this sandbox",
                               report="Nsight Compute (ncu) is not on PATH here; the kernel table still holds")
    left = min(NCU_LIMIT_S, ev.deadline - time.monotonic() - 2)
    if left < 5:
        return SanitizerReport(tool="ncu", status="skipped", report="no time left in this evaluation")
    cmd = [exe, "--target-processes", "all", "--launch-count", "1",
           "-k", f"regex:^{re.escape(kernel_base_name(kernel))}$"]
    for sec in NCU_SECTIONS:
        cmd += ["--section", sec]
    status, text = run_host_under(ev, cmd, case, seeds, specs, left)
    if status == "time limit reached":
        return SanitizerReport(tool="ncu", status=status, report=(
            "ncu replays one kernel at a time, so kernels that wait for other ranks' flags never finish under "
            "it; the kernel table above still holds"))
    return SanitizerReport(tool="ncu", status=status, report=summarise_ncu(text, NCU_METRICS) or text[-2000:])


def run_host_under(ev, tool_cmd: list[str], case: CaseSpec, seeds: list[int], specs: list[dict],
                   left: float) -> tuple[str, str]:
    """One `check` call of every rank in a fresh device host run under an external tool: (status, output)."""
    mine, theirs = socket.socketpair()
    cmd = [*tool_cmd, sys.executable, "-m", "commbench_env.judge.candidate.device_host", "--fd", str(theirs.fileno()),
           "--workdir", str(ev.workdir)]
    # one cudaMalloc per tensor: inside the caching allocator's big blocks an overrun is invisible to memcheck
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=ev.workdir, env=env)
    theirs.close()
    status = "ok"
    end = time.monotonic() + left
    try:
        mine.settimeout(left)
        ch = Channel(mine)
        ch.send({"world": ev.world, "spec": host_spec(ev, left), "library": ev.library})
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
