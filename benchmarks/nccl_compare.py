"""Measurement fidelity: our judge's busbw for plain NCCL calls against NVIDIA's nccl-tests, same GPUs, same sizes.

nccl-tests must already be built (from its public source, outside this repository); point --nccl-tests-bin at its
build folder. For each of all_reduce, all_gather, reduce_scatter, alltoall and sendrecv this runs the nccl-tests
binary (one process, all GPUs) and our judge on a submission that calls the matching torch.distributed op, then
prints busbw side by side and the ratio; target: within +-5 % at sizes >= 64 MiB. A third column times the same
submission in a bare torch loop (one process per GPU, CUDA events, the same warm-up and timed calls, no judge):
judge / torch loop is the judge's own overhead, torch loop / nccl-tests is what torch's op costs over NCCL's (for
alltoall, torch issues grouped send/recv while nccl-tests >= 2.19 calls NCCL's own ncclAlltoAll). The three run
in turn, `--repeats` times (default 3), and medians are compared: on a shared machine one 64 MiB reading can be
1.5x off the next (benchmarks/results/nccl_compare-2026-11-30-2gpu.md).

Then, for reference quality, every task reference whose golden op is one of those five (and whose metric is a
bandwidth) is judged in `cuda` mode at the card's sizes of 64 MiB and more: its busbw as a fraction of
nccl-tests' out-of-place busbw at the same size, and its percentage of the judge's roofline (the NVLink
bandwidth NVML or nvidia-smi reports, else a measured peer copy).

    python benchmarks/nccl_compare.py --nccl-tests-bin PATH/build [--sizes 67108864,268435456] [--repeats 3]
                                      [--ops all_reduce,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import socket
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from commbench_env.cards import Task, TaskCard, busbw_factor, select_tasks
from commbench_env.golden import get_op
from commbench_env.judge.host.client import JudgeClient
from commbench_env.sandbox import open_sandbox

# op -> (nccl-tests binary, golden op, entry function, submission body, in-place run?)
OPS = {
    "all_reduce": ("all_reduce_perf", "all_reduce_sum", "all_reduce",
                   "def all_reduce(x):\n    dist.all_reduce(x)\n    return x\n", True),
    "all_gather": ("all_gather_perf", "all_gather_cat", "all_gather",
                   "def all_gather(x):\n    out = torch.empty((dist.get_world_size() * x.shape[0],) + tuple(x.shape[1:]),"
                   " dtype=x.dtype, device=x.device)\n    dist.all_gather_into_tensor(out, x)\n    return out\n", False),
    "reduce_scatter": ("reduce_scatter_perf", "reduce_scatter_sum", "reduce_scatter",
                       "def reduce_scatter(x):\n    out = torch.empty((x.shape[0] // dist.get_world_size(),) + "
                       "tuple(x.shape[1:]), dtype=x.dtype, device=x.device)\n    dist.reduce_scatter_tensor(out, x)\n"
                       "    return out\n", False),
    "alltoall": ("alltoall_perf", "all_to_all", "all_to_all",
                 "def all_to_all(x):\n    out = torch.empty_like(x)\n    dist.all_to_all_single(out, x)\n    return out\n",
                 False),
    "sendrecv": ("sendrecv_perf", "ring_shift", "ring_shift",
                 "def ring_shift(x):\n    r, w = dist.get_rank(), dist.get_world_size()\n    out = torch.empty_like(x)\n"
                 "    ops = [dist.P2POp(dist.isend, x, (r + 1) % w), dist.P2POp(dist.irecv, out, (r - 1) % w)]\n"
                 "    for q in dist.batch_isend_irecv(ops):\n        q.wait()\n    return out\n", False),
}


def calibration_task(op: str, sizes: list[int], iters: int, warmup: int) -> Task:
    """An in-memory task with nothing forbidden, so a submission may call NCCL directly."""
    _, golden, fn, _, in_place = OPS[op]
    card = TaskCard.model_validate({
        "id": f"calibration/{op}", "title": f"calibration: {op}", "category": "collective", "difficulty": "easy",
        "entry": {"file": "solution.py", "functions": [fn]},
        "world": {"sizes": [2, 4, 8], "device_modes": ["cuda"]},
        "rules": {"forbidden_apis": [], "inputs_read_only": not in_place},
        "semantics": {"op": golden},
        "cases": [{"name": "v", "shape": [1024]}, {"name": "h", "visible": False, "shape": [4096]}],
        "performance": {"metric": "busbw", "sizes": sizes, "gpu_sizes": sizes, "warmup": warmup, "iters": iters,
                        "gpu_warmup": warmup, "gpu_iters": iters},
    })
    task = Task.__new__(Task)
    task.card, task.root, task.prompt, task.starter, task.hash = card, Path("."), "", "", f"calibration-{op}"
    return task


def nccl_tests(binary: Path, gpus: int, sizes: list[int], iters: int, warmup: int) -> dict[int, tuple[float, float]]:
    """size -> (out-of-place busbw, in-place busbw) in GB/s."""
    out = subprocess.run([str(binary), "-b", str(min(sizes)), "-e", str(max(sizes)), "-f", "4", "-g", str(gpus),
                          "-n", str(iters), "-w", str(warmup), "-d", "float"], capture_output=True, text=True,
                         timeout=600)
    res = {}
    for line in out.stdout.splitlines():
        f = line.split()
        # size count type redop root | time algbw busbw #wrong (out-of-place) | time algbw busbw #wrong (in-place)
        if len(f) >= 11 and f[0].isdigit() and int(f[0]) in sizes and re.fullmatch(r"[0-9.]+", f[-6]):
            res[int(f[0])] = (float(f[-6]), float(f[-2]))
    if not res:
        raise SystemExit(f"could not read {binary.name} output:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return res


def _torch_loop_rank(rank: int, world: int, port: int, op: str, sizes: list[int], iters: int, warmup: int,
                     out: dict) -> None:
    """One rank of the bare loop: the judge's inputs for each size, `warmup` calls, then `iters` calls timed
    back-to-back with CUDA events (mean over calls); rank 0 keeps the max over ranks. Without a GPU (a dry run of
    this script's code) it runs on gloo with the host clock."""
    _, golden, fn_name, body, _ = OPS[op]
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=device if gpu else None)
    ns: dict = {"torch": torch, "dist": dist}
    exec(compile(body, f"<{op} submission>", "exec"), ns)
    fn, g = ns[fn_name], get_op(golden)
    task = calibration_task(op, sizes, iters, warmup)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    for size in sizes:
        case = g.size_case(task.card.performance, size, world)
        x = g.make_inputs(case, rank, world, 1234 + rank)["x"].to(device)
        for _ in range(warmup):
            fn(x)
        sync()
        dist.barrier()
        if gpu:
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            marks[0].record()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(x)
        if gpu:
            marks[1].record()
        sync()
        us = marks[0].elapsed_time(marks[1]) * 1e3 if gpu else (time.perf_counter() - t0) * 1e6
        t = torch.tensor([us / iters], dtype=torch.float64, device=device)  # per call
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            out[size] = g.metric_bytes(case, world) / (t.item() * 1e-6) / 1e9 * busbw_factor(g.nccl_op, world)
    dist.destroy_process_group()


def torch_loop(op: str, gpus: int, sizes: list[int], iters: int, warmup: int) -> dict[int, float]:
    """size -> busbw in GB/s of the submission's op timed by a bare torch loop (no judge)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_torch_loop_rank, args=(gpus, port, op, sizes, iters, warmup, out), nprocs=gpus)
        return dict(out)


def reference_rows(client: JudgeClient, gpus: int, ops: list[str], nccl: dict[str, dict[int, tuple[float, float]]],
                   min_size: int, rows: list[tuple[str, ...]], written: Callable[[], None]) -> None:
    """Each matching task reference's busbw against nccl-tests (out-of-place) at the card's sizes >= min_size,
    appended to `rows`; `written` is called after each task so that a cut run keeps what it measured."""
    golden_to_op = {OPS[op][1]: op for op in ops}
    for task in select_tasks("all", device_mode="cuda"):
        perf = task.card.performance
        op = golden_to_op.get(task.card.semantics.op)
        sizes = [s for s in perf.sizes_for("cuda") if s >= min_size and s in nccl.get(op, {})]
        if op is None or perf.metric not in ("busbw", "algbw") or not sizes or gpus not in task.card.world.sizes:
            continue
        res = client.evaluate(task, {task.card.entry.file: task.reference_source()}, "benchmark", gpus,
                              device_mode="cuda")
        if res.verdict.value != "pass":
            rows.append((task.card.id, "-", "-", "-", "-", "-", f"judge: {res.verdict.value}: {res.summary[:80]}"))
            written()
            continue
        for s in res.benchmark:
            if s.size_bytes not in sizes:
                continue
            theirs = nccl[op][s.size_bytes][0]
            roof = f"{s.roofline_pct:.0f}% of {res.roofline.gbps:.0f} GB/s ({res.roofline.name})" \
                if res.roofline and s.roofline_pct is not None else "-"
            rows.append((task.card.id, f"{s.size_bytes >> 20} MiB", f"{s.busbw_gbps:.1f}", f"{theirs:.1f}",
                         f"{s.busbw_gbps / theirs:.2f}" if theirs else "-", roof, task.card.language.value))
            print(f"{task.card.id:<40} {s.size_bytes >> 20:>5} MiB  reference {s.busbw_gbps:8.1f}  nccl-tests "
                  f"{theirs:8.1f}  {roof}", flush=True)
        written()


def _last(xs: list[float]) -> str:
    return f"{xs[-1]:.1f}" if xs else "-"  # nccl-tests steps sizes by 4x: a size between two steps has no figure


def _cell(xs: list[float]) -> str:
    """The median; with several runs, their range too."""
    return f"{statistics.median(xs):.1f}" + (f" ({min(xs):.0f}-{max(xs):.0f})" if len(xs) > 1 else "")


def compare_op(client: JudgeClient, op: str, gpus: int, sizes: list[int], a: argparse.Namespace,
               rows: list[tuple[str, ...]], written: Callable[[], None]) -> dict[int, tuple[float, float]]:
    """nccl-tests, the torch loop and the judge on one op, `a.repeats` times in turn (so drift of a shared machine
    spreads over all three); one row per size of medians and ranges. Returns nccl-tests' medians by size."""
    binary, _, _, body, in_place = OPS[op]
    task = calibration_task(op, sizes, a.iters, a.warmup)
    src = "import torch\nimport torch.distributed as dist\n\n\n" + body
    oop: dict[int, list[float]] = {s: [] for s in sizes}
    ip: dict[int, list[float]] = {s: [] for s in sizes}
    loop: dict[int, list[float]] = {s: [] for s in sizes}
    judge: dict[int, list[float]] = {s: [] for s in sizes}
    for rep in range(a.repeats):
        for size, (o, i) in nccl_tests(Path(a.nccl_tests_bin) / binary, gpus, sizes, a.iters, a.warmup).items():
            oop[size].append(o)
            ip[size].append(i)
        for size, bw in torch_loop(op, gpus, sizes, a.iters, a.warmup).items():
            loop[size].append(bw)
        res = client.evaluate(task, {"solution.py": src}, "benchmark", gpus, device_mode="cuda", timeout_s=600)
        if res.verdict.value != "pass":
            rows.append((op, "-", "-", "-", "-", "-", "-", "-", f"judge: {res.verdict.value}: {res.summary[:80]}"))
            written()
            return {}
        for s in res.benchmark:
            judge[s.size_bytes].append(s.busbw_gbps)
        print(f"{op:<15} run {rep + 1}: " + "; ".join(
            f"{size >> 20} MiB nccl-tests {_last((ip if in_place else oop)[size])} torch loop {_last(loop[size])} "
            f"judge {_last(judge[size])}" for size in sizes), flush=True)
    for size in sizes:
        theirs_runs = ip[size] if in_place else oop[size]
        if not (theirs_runs and loop[size] and judge[size]):
            continue
        theirs, bare, ours = (statistics.median(x) for x in (theirs_runs, loop[size], judge[size]))
        rows.append((op, f"{size >> 20} MiB", _cell(theirs_runs), _cell(loop[size]), _cell(judge[size]),
                     f"{ours / theirs:.3f}", f"{ours / bare:.3f}", f"{bare / theirs:.3f}",
                     "in-place" if in_place else "out-of-place"))
    written()
    return {size: (statistics.median(oop[size]), statistics.median(ip[size])) for size in sizes if oop[size]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nccl-tests-bin", required=True)
    ap.add_argument("--sizes", default="67108864,268435456")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each of the three, in turn; medians are compared")
    ap.add_argument("--no-references", action="store_true", help="skip judging the task references")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    gpus = torch.cuda.device_count()
    rows: list[tuple[str, ...]] = []
    ref_rows: list[tuple[str, ...]] = []
    nccl: dict[str, dict[int, tuple[float, float]]] = {}
    path = Path(a.out) / f"nccl_compare-{dt.date.today().isoformat()}-{gpus}gpu.md"
    path.parent.mkdir(parents=True, exist_ok=True)

    def written() -> None:  # after every op: a run cut by a time limit keeps what it measured
        path.write_text(report(rows, ref_rows, gpus, a.iters, a.warmup, a.repeats))

    with open_sandbox("local-gpu") as sb:
        client = JudgeClient(sb)
        for op in a.ops.split(","):
            measured = compare_op(client, op, gpus, sizes, a, rows, written)
            if measured:
                nccl[op] = measured
        if not a.no_references:
            reference_rows(client, gpus, a.ops.split(","), nccl, 64 << 20, ref_rows, written)
        client.close()
    print(path.read_text())
    print(f"written {path}")


def report(rows: list[tuple[str, ...]], ref_rows: list[tuple[str, ...]], gpus: int, iters: int, warmup: int,
           repeats: int) -> str:
    head = ["op", "size", "nccl-tests busbw GB/s", "torch loop busbw GB/s", "judge busbw GB/s", "judge / nccl-tests",
            "judge / torch loop", "torch loop / nccl-tests", "note"]
    md = [f"# Judge vs nccl-tests, {gpus} x {torch.cuda.get_device_name(0)}",
          f"- {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}; nccl-tests -g {gpus} -n {iters} -w {warmup}; "
          f"judge: {warmup} warm-up and {iters} timed calls back-to-back after the judge's barrier and warm-up, "
          f"mean over calls, max over ranks; each of the three run {repeats} time(s) in turn: median (range), and "
          "ratios of medians", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    if ref_rows:
        head = ["task reference", "size", "reference busbw GB/s", "nccl-tests busbw GB/s (out-of-place)",
                "fraction of NCCL", "of roofline", "language"]
        md += ["", "## Reference quality", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        md += ["| " + " | ".join(r) + " |" for r in ref_rows]
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
