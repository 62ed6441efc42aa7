"""Disjoint GPUs for concurrent episodes on one host: one lock file per GPU, held with flock.

A lock dies with the process that holds it, so a killed run frees its GPUs. Ports need no scheduler: every
evaluation binds port 0 and lets the kernel choose.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SandboxError

LOCK_DIR = Path(os.environ.get("COMMBENCH_GPU_LOCKS", "/tmp/commbench-gpu-locks"))


def host_gpu_ids() -> list[int]:
    """GPU indices on this host (nvidia-smi; no CUDA context), honouring CUDA_VISIBLE_DEVICES if numeric."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None and all(v.strip().isdigit() for v in vis.split(",") if v.strip()):
        return [int(v) for v in vis.split(",") if v.strip()]
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split() if x.isdigit()]


@dataclass
class GpuLease:
    ids: list[int]
    _fds: list[int] = field(default_factory=list, repr=False)

    @classmethod
    def acquire(cls, count: int, *, pool: list[int] | None = None, timeout_s: float = 3600.0,
                lock_dir: Path | None = None) -> "GpuLease":
        """Wait until `count` GPUs of `pool` (default: all on the host) are free, and hold them."""
        pool = host_gpu_ids() if pool is None else pool
        if count > len(pool):
            raise SandboxError(f"{count} GPU(s) asked for, but this host has {len(pool)}")
        d = lock_dir or LOCK_DIR
        d.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        while True:
            lease = cls(ids=[])
            for gpu in pool:
                fd = os.open(d / f"gpu{gpu}.lock", os.O_RDWR | os.O_CREAT, 0o666)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                lease.ids.append(gpu)
                lease._fds.append(fd)
                if len(lease.ids) == count:
                    return lease
            lease.release()
            if time.monotonic() > deadline:
                raise SandboxError(f"no {count} free GPU(s) within {timeout_s:.0f} s")
            time.sleep(0.2)

    def release(self) -> None:
        for fd in self._fds:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            except OSError:
                pass
        self._fds = []
