"""The kernel tables of a CUDA task's `profile`, one per rank, from the torch profiler's kernel records.

Every rank of a CUDA task runs in one process (the device host), so the profiler sees all ranks' kernels at once.
They are told apart by where they ran. Under the profiler, before the call, the judge launches one marker kernel
on each rank's stream, rank r's sleeping (r + 1) units, so the markers' durations say which stream is whose
(their launch order says the same, and must agree). A kernel on rank r's (GPU, stream) is rank r's. In `cuda`
mode, where each rank has a GPU of its own, a kernel on a stream the candidate made is its GPU's rank's. Where any
kernel cannot be placed (a stream the candidate made in `cuda-shared`), the split is not trusted and one table of
all ranks' kernels is given instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MARKER = "spin_kernel"  # torch.cuda._sleep; also the start gate's fallback, never the candidate's
MARKER_UNIT_CYCLES = 20_000  # about 10 us on current GPUs: far above the jitter of a kernel's recorded duration
MAX_ROWS = 15


@dataclass(frozen=True)
class KernelRecord:
    """One kernel (or memcpy, memset) the profiler saw on a GPU."""

    name: str
    device: int
    stream: int
    start_us: float
    us: float
    order: int = 0  # launch order (the CUPTI correlation id), for the markers


def kernel_records(prof: Any) -> list[KernelRecord]:
    """The GPU activity of a finished `torch.profiler.profile`."""
    from torch.autograd import DeviceType

    return [KernelRecord(name=e.name, device=int(e.device_index), stream=int(e.device_resource_id),
                         start_us=float(e.time_range.start), us=float(e.time_range.elapsed_us()), order=int(e.id))
            for e in prof.events() if e.device_type == DeviceType.CUDA]


def table(records: list[KernelRecord]) -> list[dict]:
    """Rows by kernel name (calls, total and mean time), longest total first; the markers left out."""
    rows: dict[str, dict] = {}
    for k in records:
        if MARKER in k.name:
            continue
        name = k.name[:120]
        row = rows.setdefault(name, {"name": name, "kind": "comm" if "nccl" in name.lower() else "compute",
                                     "calls": 0, "total_us": 0.0})
        row["calls"] += 1
        row["total_us"] += k.us
    out = sorted(rows.values(), key=lambda r: r["total_us"], reverse=True)
    for row in out:
        row["mean_us"] = row["total_us"] / row["calls"]
    return out[:MAX_ROWS]


def rank_streams(records: list[KernelRecord], world: int) -> dict[tuple[int, int], int] | None:
    """(GPU, stream) -> rank from the judge's markers: the first `world` to start, ranked by duration; None where
    there are too few, two share a stream, or their durations disagree with their launch order."""
    markers = sorted((k for k in records if MARKER in k.name), key=lambda k: k.start_us)[:world]
    if len(markers) < world:
        return None
    by_duration = sorted(markers, key=lambda k: k.us)
    if by_duration != sorted(markers, key=lambda k: k.order):
        return None
    owner = {(k.device, k.stream): r for r, k in enumerate(by_duration)}
    return owner if len(owner) == world else None


def tables_by_rank(records: list[KernelRecord], devices: list[int]) -> list[list[dict]] | None:
    """One table per rank, or None where a kernel cannot be given to one rank (see the module's docstring)."""
    world = len(devices)
    owner = rank_streams(records, world)
    if owner is None:
        return None
    own_gpu = {d: r for r, d in enumerate(devices)} if len(set(devices)) == world else {}
    per_rank: list[list[KernelRecord]] = [[] for _ in range(world)]
    for k in records:
        if MARKER in k.name:
            continue
        r = owner.get((k.device, k.stream), own_gpu.get(k.device))
        if r is None:
            return None
        per_rank[r].append(k)
    return [table(ks) for ks in per_rank]
