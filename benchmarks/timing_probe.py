"""Why a per-call GPU clock can read slower than a back-to-back loop: the same operation timed several ways.

nccl-tests times a loop of back-to-back launches; the judge times one call at a time, each after a device-side
start line, with host work (staging inputs, verification) between calls. This probe times one operation both
ways on the same GPUs, in one run, so the gap and its cause can be read off side by side:

- `back-to-back`: N calls between two CUDA events, divided by N (the nccl-tests way);
- `per call`: one call between two events after the judge's start line (a 200 us GPU sleep that lets the host
  queue the launch), with the device idle for `--idle-ms` before each call (as between the judge's iterations),
  or not idle, or idle and then the judge's warm-up (`commbench_env.judge.candidate.device.WarmUp`, about 3 ms of
  memory-bound work) queued before the start line, which is how the judge times every call.

It runs a device-to-device copy on GPU 0 and, with two or more GPUs, an NCCL all-reduce over all of them
(one process per GPU), and prints the SM clock NVML reports when idle and right after a busy kernel.

    python benchmarks/timing_probe.py [--sizes 67108864,268435456] [--idle-ms 20] [--calls 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from commbench_env.judge.candidate.device import WarmUp, sleep_cycles

SLACK_S = 200e-6
VARIANTS = ("back-to-back", "per call, idle", "per call, not idle", "per call, idle, judge warm-up first")


def _time_variant(variant: str, op, warm_up: WarmUp, calls: int, idle_s: float, align) -> float:
    """Mean microseconds per call of `op` on this device, timed as `variant` says."""
    ev = torch.cuda.Event
    if variant == "back-to-back":
        torch.cuda.synchronize()
        align()
        torch.cuda._sleep(sleep_cycles(torch, torch.cuda.current_device(), SLACK_S))
        start, stop = ev(enable_timing=True), ev(enable_timing=True)
        start.record()
        for _ in range(calls):
            op()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) * 1e3 / calls
    times = []
    for _ in range(max(3, calls // 2)):
        torch.cuda.synchronize()
        if "idle" in variant and "not idle" not in variant:
            time.sleep(idle_s)
        align()
        if "warm-up" in variant:
            warm_up()
        else:
            torch.cuda._sleep(sleep_cycles(torch, torch.cuda.current_device(), SLACK_S))
        start, stop = ev(enable_timing=True), ev(enable_timing=True)
        start.record()
        op()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.mean(times)


def _sm_clock(index: int) -> tuple[int, int]:
    """SM clock in MHz (idle for 50 ms, then during a busy kernel)."""
    try:
        import pynvml as nv

        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(index)
        torch.cuda.synchronize()
        time.sleep(0.05)
        idle = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        heat = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        for _ in range(40):
            heat.add_(1)
        busy = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        torch.cuda.synchronize()
        return idle, busy
    except Exception:  # noqa: BLE001 - a probe: no NVML means no clock column
        return -1, -1


def copy_probe(sizes: list[int], calls: int, idle_s: float) -> list[str]:
    torch.cuda.set_device(0)
    warm_up = WarmUp(torch, torch.device("cuda", 0))
    idle, busy = _sm_clock(0)
    rows = [f"GPU 0 SM clock: {idle} MHz after 50 ms idle, {busy} MHz during a busy kernel", "",
            "| operation | size | " + " | ".join(VARIANTS) + " |", "|---|---|" + "---|" * len(VARIANTS)]
    for size in sizes:
        src = torch.randn(size // 4, device="cuda")
        dst = torch.empty_like(src)
        dst.copy_(src)
        cells = []
        for v in VARIANTS:
            us = _time_variant(v, lambda: dst.copy_(src), warm_up, calls, idle_s, lambda: None)
            cells.append(f"{us:.1f} us, {size / us / 1e3:.0f} GB/s")
        rows.append(f"| device copy (1 GPU) | {size >> 20} MiB | " + " | ".join(cells) + " |")
    return rows


def _nccl_rank(rank: int, world: int, sizes: list[int], calls: int, idle_s: float, port: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    one = torch.zeros(1, device="cuda")
    warm_up = WarmUp(torch, torch.device("cuda", rank))
    results = []
    for size in sizes:
        x = torch.randn(size // 4, device="cuda")
        for _ in range(3):
            dist.all_reduce(x)
        for v in VARIANTS:
            dist.barrier()
            us = _time_variant(v, lambda: dist.all_reduce(x), warm_up, calls, idle_s, lambda: dist.all_reduce(one))
            t = torch.tensor([us], device="cuda")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # max over ranks
            results.append((size, v, float(t)))
    if rank == 0:
        q.put(results)
    dist.destroy_process_group()


def nccl_probe(sizes: list[int], calls: int, idle_s: float) -> list[str]:
    world = torch.cuda.device_count()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=_nccl_rank, args=(r, world, sizes, calls, idle_s, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    results = q.get(timeout=300)
    for p in procs:
        p.join()
    factor = 2 * (world - 1) / world  # all-reduce busbw, nccl-tests convention
    rows = []
    for size in sizes:
        cells = [f"{us:.1f} us, {size / us / 1e3 * factor:.0f} GB/s busbw" for s, v, us in results if s == size]
        rows.append(f"| NCCL all_reduce ({world} GPUs) | {size >> 20} MiB | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="67108864,268435456")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--idle-ms", type=float, default=20.0)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("timing_probe needs a CUDA GPU; this machine has none")
    sizes = [int(s) for s in a.sizes.split(",")]
    rows = copy_probe(sizes, a.calls, a.idle_ms / 1e3)
    if torch.cuda.device_count() >= 2:
        rows += nccl_probe(sizes, a.calls, a.idle_ms / 1e3)
    print(f"# timing probe: {torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}, torch {torch.__version__}, "
          f"{a.calls} calls back-to-back, {a.idle_ms:g} ms idle before each per-call timing")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
