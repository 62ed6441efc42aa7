"""Inputs of many timed calls, built on the host a batch at a time on a thread pool (the device host's).

Why: on a GPU each benchmark size runs nccl-tests' 5 warm-up and 20 timed calls, each on fresh random inputs made
on the CPU from a private seed (so the coordinator can make them again to verify). Made one after another, they
were the largest part of a `cuda` task's evaluation: 25 calls x 2 ranks x 64 MiB of `torch.randn` take about 4.5 s
on one core, for that size alone. torch's CPU generators release the GIL and each call has its own, so a pool makes
them side by side (0.27 of the serial time on a 32-core GPU host: benchmarks/verify_threads.py).
Batches keep the memory bounded (threads x one call's inputs) and leave the pool idle while the caller runs the
calls: nothing competes with a timed call for the host.

The torch rank harness does not use it: there candidate Python shares the process, and a pool would add
concurrent.futures to what integrity.py must keep unpatched; its ranks already make their inputs side by side.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

STAGING_THREADS = 8


def usable_cores() -> int:
    """Cores this process may run on (a container's CPU set, not the whole machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def in_batches(make: Callable[[T], R], items: Iterable[T], threads: int = STAGING_THREADS) -> Iterator[R]:
    """`make(item)` for every item, in order, computed `threads` at a time; the pool is idle between batches."""
    workers = max(1, min(threads, usable_cores()))
    it = iter(items)
    if workers == 1:
        yield from map(make, it)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="staging") as pool:
        while batch := list(islice(it, workers)):
            yield from list(pool.map(make, batch))
