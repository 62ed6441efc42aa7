"""Run every GPU-capable task's reference on this machine's GPUs and print what it reaches.

For each device mode the machine supports (`cuda`: one rank per GPU over NCCL, needs >= 2 GPUs; `cuda-shared`:
all ranks on one GPU) and each world size, the reference is judged in `full` mode (hidden cases + benchmark).
The table gives correctness, the task's metric at its largest size, and its percentage of the roofline that the
judge measured in the same evaluation (`JudgeResult.roofline`): each rank's share of the device's own copy
bandwidth in `cuda-shared` (figures there are emulated, never NVLink), the NVLink bandwidth NVML reports (or,
failing that, a measured peer copy) in `cuda`. In `cuda-shared` an all-gather's or all-to-all's busbw is measured
against that share times (world - 1) / world: each rank also copies its own block through the same copy bandwidth,
and busbw does not count it. Copy-only references must reach 70 % in `cuda-shared` at 64 MiB.

    python benchmarks/gpu_validate.py [--modes cuda,cuda-shared] [--worlds 2,4] [--tasks all] [--out DIR] [--trace FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import shutil
import re
import subprocess
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from commbench_env.cards import DeviceMode, select_tasks
from commbench_env.errors import CommBenchError
from commbench_env.judge.host.client import JudgeClient
from commbench_env.sandbox import GPU_PROFILE_FOR_MODE, load_profile, open_sandbox

# references that only move bytes: in cuda-shared at >= 64 MiB they must reach COPY_TARGET of the device copy
COPY_TASKS = ("p2p/ipc_pull_copy", "p2p/ipc_push_copy", "p2p/tma_bulk_push", "collective/allgather_fullmesh")
COPY_TARGET_PCT = 70.0
WAITING = "waiting: needs 2 or more GPUs (one rank per GPU)"


def machine_header() -> list[str]:
    lines = [f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
             f"- host: {platform.node()}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}",
             f"- torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"]
    if shutil.which("nvidia-smi"):
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, check=False).stdout.split("\n")[0]
        lines.append(f"- driver {drv}")
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=False).stdout.strip()
        topo = re.sub(r"\x1b\[[0-9;]*m", "", topo)  # nvidia-smi underlines the header with terminal codes
        lines += ["- topology (`nvidia-smi topo -m`):", "", "```", topo, "```"]
    return lines


def figure(res, metric: str) -> tuple[str, str, float | None]:
    """(the metric at the largest size, its percentage of the judge's roofline, that percentage)."""
    if not res or not res.benchmark:
        return "-", "-", None
    if metric == "latency":
        s = min(res.benchmark, key=lambda b: b.size_bytes)
        return f"{s.time_us:.1f} us @ {s.size_bytes} B", "-", None
    s = max(res.benchmark, key=lambda b: b.size_bytes)
    if metric == "tflops":
        return f"{s.tflops:.2f} TFLOP/s", "-", None
    value = s.busbw_gbps if metric == "busbw" else s.algbw_gbps
    text = f"{value:.1f} GB/s {metric} @ {s.size_bytes >> 20} MiB"
    roof = res.roofline
    if s.roofline_pct is None or roof is None:
        return text, "-", None
    of = s.roofline_gbps or roof.per_rank_gbps
    bound = res.roofline_bound
    own = roof.per_rank_gbps * bound  # what is left once the card's bound is applied
    parts = []
    if bound < 1:
        parts.append(f"the task's bound: {bound:g} of {roof.per_rank_gbps:.0f} GB/s per rank")
    if of < own * 0.999:
        parts.append("less the own block that busbw leaves out")
    less = "; " + ", ".join(parts) if parts else ""
    return text, f"{s.roofline_pct:.0f}% of {of:.0f} GB/s ({roof.name}{less})", s.roofline_pct


def split(res) -> str:
    """Where an evaluation's time went, so slow tasks can be told apart from slow kernels."""
    if res is None:
        return "-"
    t = res.timings
    return f"{t.compile_s:.1f}/{t.launch_s + t.load_s:.1f}/{t.run_s:.1f}/{t.verify_s:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="cuda,cuda-shared")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per evaluation (default: the card's limit)")
    ap.add_argument("--trace", help="append the device host's timing trace (one JSON line per timed call) here")
    a = ap.parse_args()
    console = Console(width=200)
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run this on a GPU machine")
    gpus = torch.cuda.device_count()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # '_' joins the lists: the device tool does not bring back files whose names hold '+'
    path = out / (f"gpu_validate-{dt.date.today().isoformat()}-{gpus}gpu-{a.modes.replace(',', '_')}"
                  f"-w{a.worlds.replace(',', '_')}.md")
    header = machine_header()
    cols = ("task", "language", "mode", "world", "correct", "figure", "of roofline", "extended calls",
            "seconds (build/start/run/verify)")
    rows, copy_checks = [], []

    def write_report(final: bool) -> int:
        """The markdown table so far (rewritten after every row, so a run cut short keeps what it measured)."""
        failures = sum(not r[4].startswith("yes") and r[4] != WAITING for r in rows)
        md = ["# GPU validation of task references", "", *header, "",
              "Figures in `cuda-shared` are emulated (all ranks on one GPU) and bounded by its copy bandwidth. "
              "Extended calls: timed calls whose clock ran on to a device-wide sync (work outlived the stop event; "
              "an honest reference should show 0).", "",
              *([] if final else ["**Incomplete: the run was still going (or was cut short) when this was written.**",
                                  ""]),
              "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        md += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
        if copy_checks:
            md += ["", (f"Copy-bandwidth check (cuda-shared, >= 64 MiB, target {COPY_TARGET_PCT:.0f}% of the device "
                        "copy bandwidth shared by the ranks, measured by the judge in the same evaluation):"), ""]
            for tid, world, size, pct in copy_checks:
                ok = size >= 64 << 20 and pct is not None and pct >= COPY_TARGET_PCT
                failures += not ok
                md.append(f"- {tid} world {world} at {size >> 20} MiB: "
                          f"{pct if pct is not None else float('nan'):.0f}% {'meets' if ok else 'MISSES'} the target")
        path.write_text("\n".join(md) + "\n")
        return failures

    for mode in a.modes.split(","):
        if mode == "cuda" and gpus < 2:
            # listed, not judged: the table says which tasks this machine cannot validate and why
            waiting = [t for t in select_tasks(a.tasks, device_mode=mode)
                       if DeviceMode.cuda_shared not in t.card.world.device_modes]
            console.print(f"[yellow]mode cuda needs at least 2 GPUs: {len(waiting)} task(s) that run only in it are "
                          "listed as waiting[/]")
            rows += [(t.id, t.card.language.value, mode, "-", WAITING, "-", "-", "-", "-") for t in waiting]
            continue
        profile = load_profile(GPU_PROFILE_FOR_MODE[mode])
        if a.trace:
            profile = profile.with_env({"COMMBENCH_TIMING_TRACE": a.trace})
        with open_sandbox(profile) as sb:
            client = JudgeClient(sb)
            for task in select_tasks(a.tasks, device_mode=mode):
                for world in (int(w) for w in a.worlds.split(",")):
                    if world not in task.card.world.sizes or (mode == "cuda" and world > gpus):
                        continue
                    t0 = time.monotonic()
                    try:
                        res = client.evaluate(task, {task.card.entry.file: task.reference_source()}, "full", world,
                                              device_mode=mode, timeout_s=a.timeout)
                        verdict, summary = res.verdict.value, res.summary
                    except CommBenchError as exc:
                        res, verdict, summary = None, "infra_error", str(exc)
                    ok = verdict == "pass"
                    text, pct_text, pct = figure(res, task.card.performance.metric)
                    if mode == "cuda-shared" and task.id in COPY_TASKS and ok:
                        big = max(res.benchmark, key=lambda b: b.size_bytes)
                        copy_checks.append((task.id, world, big.size_bytes, pct))
                    rows.append((task.id, task.card.language.value, mode, world,
                                 "yes" if ok else f"NO ({verdict}: {summary.splitlines()[0][:70] if summary else ''})",
                                 text, pct_text, sum(b.extended_calls for b in res.benchmark) if res else "-",
                                 f"{time.monotonic() - t0:.1f} ({split(res)})"))
                    console.print(" | ".join(map(str, rows[-1])), markup=False, highlight=False)
                    if not ok:
                        console.print(res.feedback(3000) if res else summary, markup=False, highlight=False)
                    write_report(final=False)
            client.close()
    table = Table(title="GPU validation of references")
    for c in cols:
        table.add_column(c)
    for r in rows:
        table.add_row(*map(str, r))
    console.print(table)
    failures = write_report(final=True)
    console.print(f"written {path}; {failures} failure(s)")


if __name__ == "__main__":
    main()
