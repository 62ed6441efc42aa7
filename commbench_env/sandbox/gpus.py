"""Disjoint GPUs for concurrent episodes on one host: one lock file per GPU, held with flock.

A lock dies with the process that holds it, so a killed run frees its GPUs. Which free GPUs to take is a
topology question: `GpuTopology` scores every pair (NVLink lanes beat a PCIe switch, which beats the CPU
interconnect) and picks the set whose weakest link is best. The judge's own rendezvous binds port 0 and lets
the kernel choose; fixed ports, where something needs them, come from `ports.PortLease`.
"""

from __future__ import annotations

import fcntl
import itertools
import math
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SandboxError

if TYPE_CHECKING:
    from .profiles import SandboxProfile

LOCK_DIR = Path(os.environ.get("COMMBENCH_GPU_LOCKS", "/tmp/commbench-gpu-locks"))
# Pair scores: higher is a better link. NVLink pairs score NVLINK_BASE + lanes; PCIe pairs PCIE_BASE - NVML level
# (NVML_TOPOLOGY_INTERNAL 0, SINGLE 10, MULTIPLE 20, HOSTBRIDGE 30, NODE 40, SYSTEM 50).
NVLINK_BASE = 1000
PCIE_BASE = 100
EXHAUSTIVE_LIMIT = 5000  # subsets examined exactly; beyond this a greedy choice


def host_gpu_ids() -> list[int]:
    """GPU indices on this host (nvidia-smi; no CUDA context), honouring CUDA_VISIBLE_DEVICES if numeric."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None and all(v.strip().isdigit() for v in vis.split(",") if v.strip()):
        return [int(v) for v in vis.split(",") if v.strip()]
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split() if x.isdigit()]


def lock_ids(profile: SandboxProfile, world: int) -> list[int]:
    """The GPUs a sandbox of `profile` runs `world` ranks on, by their lock ids (nvidia-smi indices): its
    `gpus.ids`, else the host's first GPUs; `world` of them in `cuda`, one in `cuda-shared`. None where the
    profile does not lease (`SandboxProfile.leases_gpus`) or where the sandbox holds a lease of its own for its
    lifetime (docker with `gpus.count`)."""
    if not profile.leases_gpus or (profile.backend == "docker" and profile.gpus.count):
        return []
    ids = list(profile.gpus.ids) or host_gpu_ids()
    return ids[:world if profile.device_mode == "cuda" else 1]


def try_lock(path: Path) -> int | None:
    """An exclusive flock on `path` without waiting: its open descriptor (keep it to hold the lock), or None if
    another process holds it. Locks die with their process, so a crashed holder never leaks one."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@dataclass(frozen=True)
class GpuTopology:
    """The GPUs a scheduler may hand out and how well each pair is linked (`links[(a, b)]`, a < b; missing: 0)."""

    ids: tuple[int, ...]
    links: Mapping[tuple[int, int], int] = field(default_factory=dict)
    source: str = "given"

    @classmethod
    def of(cls, ids: Iterable[int], links: Mapping[tuple[int, int], int] | None = None,
           source: str = "given") -> GpuTopology:
        norm = {(min(a, b), max(a, b)): int(s) for (a, b), s in (links or {}).items()}
        return cls(ids=tuple(ids), links=norm, source=source)

    @classmethod
    def detect(cls, restrict: Iterable[int] | None = None) -> GpuTopology:
        """NVML's view of this host's GPUs where nvidia-ml-py and a driver are present; else the ids from
        nvidia-smi (or CUDA_VISIBLE_DEVICES) with unknown links; else no GPUs. `restrict`: only these ids."""
        try:
            topo = nvml_topology()
        except Exception as exc:  # noqa: BLE001 - pynvml's NVMLError_* (no driver, no device) or no pynvml
            if not (isinstance(exc, (ImportError, OSError)) or type(exc).__name__.startswith("NVMLError")):
                raise
            topo = cls.of(host_gpu_ids(), source="nvidia-smi")
        allowed = set(restrict) if restrict else None
        if topo.source == "nvml" and os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            visible = set(host_gpu_ids())
            allowed = visible if allowed is None else allowed & visible
        if allowed is None:
            return topo
        return cls(ids=tuple(i for i in topo.ids if i in allowed), links=topo.links, source=topo.source)

    def score(self, a: int, b: int) -> int:
        return self.links.get((min(a, b), max(a, b)), 0)

    def _key(self, group: tuple[int, ...]) -> tuple[int, int]:
        pairs = [self.score(a, b) for a, b in itertools.combinations(group, 2)]
        return (min(pairs), sum(pairs)) if pairs else (0, 0)

    def choose(self, free: list[int], count: int) -> list[int]:
        """The `count` GPUs of `free` whose weakest pairwise link is best (then the best total, then the lowest
        ids). With no link information this is simply the lowest free ids."""
        free = sorted(free)
        if count <= 0:
            return []
        if count >= len(free) or count == 1 or not self.links:
            return free[:count]
        if math.comb(len(free), count) <= EXHAUSTIVE_LIMIT:
            best = max(itertools.combinations(free, count), key=lambda g: (*self._key(g), [-i for i in g]))
            return list(best)
        # greedy: the best pair, then repeatedly the GPU whose weakest link to the group is best
        group = list(max(itertools.combinations(free, 2), key=lambda p: (self.score(*p), -p[0], -p[1])))
        while len(group) < count:
            rest = [g for g in free if g not in group]
            group.append(max(rest, key=lambda g: (min(self.score(g, x) for x in group),
                                                  sum(self.score(g, x) for x in group), -g)))
        return sorted(group)


def nvml_topology() -> GpuTopology:
    """Pair scores from NVML (package nvidia-ml-py, the `gpu` extra): NVLink lanes between two GPUs (direct, or
    through NVSwitches when NVML reports NVLink peer-to-peer), else the PCIe common-ancestor level."""
    import pynvml as nv

    nv.nvmlInit()
    try:
        n = nv.nvmlDeviceGetCount()
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        bus = [_bus_id(nv.nvmlDeviceGetPciInfo(h)) for h in handles]
        lanes_to: list[dict[str, int]] = []
        active: list[int] = []
        for h in handles:
            per_peer: dict[str, int] = {}
            total = 0
            for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                        continue
                    remote = _bus_id(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link))
                except nv.NVMLError:
                    continue
                total += 1
                per_peer[remote] = per_peer.get(remote, 0) + 1
            lanes_to.append(per_peer)
            active.append(total)
        links: dict[tuple[int, int], int] = {}
        for a, b in itertools.combinations(range(n), 2):
            direct = lanes_to[a].get(bus[b], 0)
            try:
                p2p = nv.nvmlDeviceGetP2PStatus(handles[a], handles[b], nv.NVML_P2P_CAPS_INDEX_NVLINK) == \
                    nv.NVML_P2P_STATUS_OK
            except nv.NVMLError:
                p2p = False
            if direct or p2p:
                links[(a, b)] = NVLINK_BASE + (direct or min(active[a], active[b]))
            else:
                try:
                    level = int(nv.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))
                except nv.NVMLError:
                    level = 50
                links[(a, b)] = PCIE_BASE - level
        return GpuTopology(ids=tuple(range(n)), links=links, source="nvml")
    finally:
        nv.nvmlShutdown()


def _bus_id(pci) -> str:
    raw = pci.busId
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return text.lower().lstrip("0")  # NVML pads the domain to 8 or 4 hex digits depending on the call


@dataclass
class GpuLease:
    ids: list[int]
    _fds: list[int] = field(default_factory=list, repr=False)

    @classmethod
    def acquire(cls, count: int, *, pool: list[int] | None = None, timeout_s: float = 3600.0,
                lock_dir: Path | None = None,
                choose: Callable[[list[int], int], list[int]] | None = None) -> GpuLease:
        """Wait until `count` GPUs of `pool` (default: all on the host) are free, and hold them.

        Without `choose`, the first free ones in pool order. With it (e.g. `GpuTopology.choose`), every free GPU
        is locked for a moment, `choose(free, count)` picks the set, and the others are let go at once.
        `timeout_s=0` tries once.
        """
        pool = host_gpu_ids() if pool is None else pool
        if count <= 0:
            return cls(ids=[])
        if count > len(pool):
            raise SandboxError(f"{count} GPU(s) asked for, but this host has {len(pool)}")
        d = lock_dir or LOCK_DIR
        d.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        while True:
            held: dict[int, int] = {}
            for gpu in pool:
                fd = try_lock(d / f"gpu{gpu}.lock")
                if fd is None:
                    continue
                held[gpu] = fd
                if choose is None and len(held) == count:
                    break
            if len(held) >= count:
                pick = list(held)[:count] if choose is None else list(choose(sorted(held), count))
                if len(set(pick)) != count or not set(pick) <= set(held):
                    _unlock(held.values())
                    raise SandboxError(f"the GPU chooser returned {pick} for {count} of {sorted(held)}")
                _unlock(fd for g, fd in held.items() if g not in pick)
                return cls(ids=pick, _fds=[held[g] for g in pick])
            _unlock(held.values())
            if time.monotonic() >= deadline:
                raise SandboxError(f"no {count} free GPU(s) within {timeout_s:.0f} s")
            time.sleep(0.2)

    def release(self) -> None:
        _unlock(self._fds)
        self._fds = []


def _unlock(fds: Iterable[int]) -> None:
    for fd in list(fds):
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        except OSError:
            pass
