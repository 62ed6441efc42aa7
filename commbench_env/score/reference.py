"""Reference figures: the task's expert solution benchmarked on the same hardware, cached per hardware + task."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..cards import Task
from ..errors import JudgeInfraError
from ..judge.host.client import JudgeClient
from ..judge.host.result import SizeResult, Verdict
from .reward import scored
from ..paths import cache_dir
from ..sandbox import SandboxProfile, open_sandbox

# Bump when the judge's way of timing changes: a figure measured one way must never be the yardstick for another
# (2: GPU calls timed back-to-back after a warm-up, nccl-tests' iteration counts on GPUs, median of 3 runs;
# 3: torch candidates run on their own thread with torch's intra-op thread count set: a matmul task's figures cached
# by a judge between the two read 13x slower than now, so its reference scored a 10x speedup over itself).
TIMING_VERSION = 6  # 4: CPU timed by the coordinator, GPU on the mean; 5: CPU on the modelled time; 6: its port calendar
GPU_RUNS = 3  # reference runs on a GPU; each size keeps its median run (one run's outliers moved rewards by 0.04)


def limits_key(profile: SandboxProfile) -> str:
    """What of a sandbox profile moves timings beyond the hardware: its CPU, memory and thread limits, and on CPUs
    the link model the modelled time stands for."""
    d = profile.docker
    key = json.dumps([profile.backend, profile.threads_per_rank, profile.limits.memory_mb,
                      d.cpus if profile.backend == "docker" else None,
                      d.memory_mb if profile.backend == "docker" else None]
                     + ([profile.link_model.model_dump(mode="json")] if profile.device_mode == "cpu" else []))
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def _cache_path(task: Task, fingerprint: str, world: int, device_mode: str, limits: str) -> Path:
    safe = task.id.replace("/", "__")
    return (cache_dir() / "reference" / f"t{TIMING_VERSION}" / f"{fingerprint}-{limits}"
            / f"{safe}-{task.hash}-w{world}-{device_mode}.json")


def _median_runs(runs: list[list[SizeResult]]) -> list[SizeResult]:
    """Per size, the run whose median iteration is the middle one of all runs."""
    out = []
    for per_size in zip(*runs):
        ranked = sorted(per_size, key=scored)
        out.append(ranked[len(ranked) // 2])
    return out


def reference_figures(client: JudgeClient, task: Task, world: int, *, refresh: bool = False) -> list[SizeResult]:
    """Benchmark the reference once per (hardware fingerprint, task hash, world, device mode) and cache it; on a GPU,
    keep each size's median of GPU_RUNS runs. The reference runs in a fresh sandbox of the client's profile, never
    in the client's own, where candidate code has run: a candidate must not move its own yardstick."""
    hw = client.sandbox.hardware()
    mode = client.sandbox.profile.device_mode
    path = _cache_path(task, hw.fingerprint, world, mode, limits_key(client.sandbox.profile))
    if path.is_file() and not refresh:
        try:
            return [SizeResult.model_validate(s) for s in json.loads(path.read_text())["sizes"]]
        except (ValueError, KeyError):
            pass  # a corrupt cache entry is re-measured
    runs = []
    with open_sandbox(client.sandbox.profile) as fresh:
        judge = JudgeClient(fresh)
        try:
            for _ in range(1 if mode == "cpu" else GPU_RUNS):
                res = judge.evaluate(task, {task.card.entry.file: task.reference_source()}, "benchmark", world)
                if res.verdict != Verdict.passed:
                    raise JudgeInfraError(f"the reference of {task.id} failed its own benchmark "
                                          f"({res.verdict.value}): {res.summary}")
                runs.append(res.benchmark)
        finally:
            judge.close()
    sizes = _median_runs(runs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"task": task.id, "task_hash": task.hash, "hardware": hw.model_dump(),
                               "world": world, "device_mode": mode,
                               "runs": len(runs), "sizes": [s.model_dump() for s in sizes]}, indent=1))
    tmp.replace(path)
    return sizes
