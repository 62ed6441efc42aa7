"""Run every GPU-capable task's reference on this machine's GPUs and print what it reaches.

For each device mode the machine supports (`cuda`: one rank per GPU over NCCL, needs >= 2 GPUs; `cuda-shared`:
all ranks on one GPU) and each world size, the reference is judged in `full` mode (hidden cases + benchmark).
The table gives correctness, the task's metric at its largest size, and the percentage of the roofline measured
in the same run: the device's own copy bandwidth in `cuda-shared` (figures there are emulated, never NVLink), the
NVLink bandwidth NVML reports (or, failing that, a measured peer copy) in `cuda`.

    python benchmarks/gpu_validate.py [--modes cuda,cuda-shared] [--worlds 2,4] [--tasks all] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import shutil
import subprocess
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from commbench_env.cards import select_tasks
from commbench_env.errors import CommBenchError
from commbench_env.judge.client import JudgeClient
from commbench_env.sandbox import open_sandbox

PROFILES = {"cuda": "local-gpu", "cuda-shared": "local-gpu-shared"}


def copy_bandwidth_gbps(nbytes: int = 1 << 30, src_dev: int = 0, dst_dev: int = 0, reps: int = 10) -> float:
    """Payload bytes per second of tensor.copy_ (the copy engine), as GB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src_dev}")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst_dev}")
    dst.copy_(src)
    torch.cuda.synchronize(src_dev)
    torch.cuda.synchronize(dst_dev)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        dst.copy_(src)
    stop.record()
    stop.synchronize()
    torch.cuda.synchronize(src_dev)
    seconds = start.elapsed_time(stop) / 1e3 / reps
    del src, dst
    torch.cuda.empty_cache()
    return nbytes / seconds / 1e9


def nvlink_gbps() -> float | None:
    """Per-direction NVLink bandwidth of GPU 0 from NVML: active links x per-link speed."""
    try:
        import pynvml as nv

        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(0)
        active = 0
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                active += nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED
            except nv.NVMLError:
                break
        fv = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON])[0]
        mbps = fv.value.uiVal if fv.nvmlReturn == 0 else 0
        return active * mbps / 1e3 if active and mbps else None
    except Exception:  # noqa: BLE001 - NVML missing or old: fall back to a measured copy
        return None


def machine_header() -> list[str]:
    lines = [f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
             f"- host: {platform.node()}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}",
             f"- torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"]
    if shutil.which("nvidia-smi"):
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.split("\n")[0]
        lines.append(f"- driver {drv}")
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout.strip()
        lines += ["- topology (`nvidia-smi topo -m`):", "", "```", topo, "```"]
    return lines


def figure(res, metric: str) -> tuple[str, float | None]:
    if not res.benchmark:
        return "-", None
    if metric == "latency":
        s = min(res.benchmark, key=lambda b: b.size_bytes)
        return f"{s.time_us:.1f} us", None
    s = max(res.benchmark, key=lambda b: b.size_bytes)
    if metric == "tflops":
        return f"{s.tflops:.2f} TFLOP/s", None
    value = s.busbw_gbps if metric == "busbw" else s.algbw_gbps
    return f"{value:.1f} GB/s {metric} @ {s.size_bytes >> 20} MiB", value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="cuda,cuda-shared")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per evaluation")
    a = ap.parse_args()
    console = Console(width=200)
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run this on a GPU machine")
    gpus = torch.cuda.device_count()
    roof = {"cuda-shared": ("device copy", copy_bandwidth_gbps())}
    if gpus >= 2:
        nv = nvlink_gbps()
        roof["cuda"] = ("NVLink (NVML)", nv) if nv else ("peer copy", copy_bandwidth_gbps(src_dev=0, dst_dev=1))
    rows, failures = [], 0
    for mode in a.modes.split(","):
        if mode == "cuda" and gpus < 2:
            console.print("[yellow]skipping mode cuda: it needs at least 2 GPUs[/]")
            continue
        with open_sandbox(PROFILES[mode]) as sb:
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
                    failures += not ok
                    text, value = figure(res, task.card.performance.metric) if res else ("-", None)
                    name, bw = roof[mode]
                    pct = f"{100 * value / bw:.0f}% of {name} {bw:.0f} GB/s" if value and bw else "-"
                    rows.append((task.id, mode, world, "yes" if ok else f"NO ({verdict}: {summary.splitlines()[0][:70]})",
                                 text, pct, f"{time.monotonic() - t0:.1f}"))
                    console.print(f"{task.id} {mode} w{world}: {rows[-1][3]} {text} {pct}")
                    if not ok:
                        console.print(res.feedback(3000) if res else summary, markup=False, highlight=False)
            client.close()
    table = Table(title="GPU validation of references")
    cols = ("task", "mode", "world", "correct", "figure", "roofline", "seconds")
    for c in cols:
        table.add_column(c)
    for r in rows:
        table.add_row(*map(str, r))
    console.print(table)
    md = ["# GPU validation of task references", "", *machine_header(), "",
          "Figures in `cuda-shared` are emulated (all ranks on one GPU) and bounded by its copy bandwidth.", "",
          "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    md += ["", "roofline: " + "; ".join(f"{m}: {n} {b:.0f} GB/s" for m, (n, b) in roof.items() if b)]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu_validate-{dt.date.today().isoformat()}-{gpus}gpu.md"
    path.write_text("\n".join(md) + "\n")
    console.print(f"written {path}; {failures} failure(s)")


if __name__ == "__main__":
    main()
