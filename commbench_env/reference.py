"""Reference figures: the task's expert solution benchmarked on the same hardware, cached per hardware + task."""

from __future__ import annotations

import json
from pathlib import Path

from .cards import Task
from .errors import JudgeInfraError
from .judge.client import JudgeClient
from .judge.result import SizeResult, Verdict
from .paths import cache_dir


def _cache_path(task: Task, fingerprint: str, world: int, device_mode: str) -> Path:
    safe = task.id.replace("/", "__")
    return cache_dir() / "reference" / fingerprint / f"{safe}-{task.hash}-w{world}-{device_mode}.json"


def reference_figures(client: JudgeClient, task: Task, world: int, *, refresh: bool = False) -> list[SizeResult]:
    """Benchmark the reference once per (hardware fingerprint, task hash, world, device mode) and cache it."""
    hw = client.sandbox.hardware()
    mode = client.sandbox.profile.device_mode
    path = _cache_path(task, hw.fingerprint, world, mode)
    if path.is_file() and not refresh:
        try:
            return [SizeResult.model_validate(s) for s in json.loads(path.read_text())["sizes"]]
        except (ValueError, KeyError):
            pass  # a corrupt cache entry is re-measured
    res = client.evaluate(task, {task.card.entry.file: task.reference_source()}, "benchmark", world)
    if res.verdict != Verdict.passed:
        raise JudgeInfraError(f"the reference of {task.id} failed its own benchmark ({res.verdict.value}): {res.summary}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"task": task.id, "task_hash": task.hash, "hardware": hw.model_dump(),
                               "world": world, "device_mode": mode,
                               "sizes": [s.model_dump() for s in res.benchmark]}, indent=1))
    tmp.replace(path)
    return res.benchmark
