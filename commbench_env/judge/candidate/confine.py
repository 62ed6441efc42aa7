"""The kernel-level confinement of a candidate process (a rank or the CUDA device host), applied by the harness
after it has set up its process group and before any candidate code exists.

- Landlock: writes only in the process's own folder; reads only system and interpreter paths, never the task
  cards, the sandbox folder (other ranks' folders) or another process's /proc entry.
- seccomp: no process creation or exec (so nothing can outlive the evaluation), no ptrace or signals to others,
  no new sockets or connections on the CPU (the process group is connected by then), no SysV IPC.

What was applied is reported before candidate code runs, and the coordinator takes it from that message only.
A missing layer is reported, never hidden: JudgeResult.isolation says which layers held.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import landlock, seccomp_filter


def confine(spec: dict[str, Any], dev: Any, rdir: Path | None = None, extra_readable: tuple[str, ...] = (),
            extra_writable: tuple[str, ...] = ()) -> dict[str, Any]:
    """Confine this process; returns the isolation report (which layers are in force)."""
    iso: dict[str, Any] = {"non_dumpable": True, "landlock_abi": 0, "seccomp": False}
    own = str(rdir or Path.cwd())
    if spec.get("landlock", True):
        if dev.is_cuda:  # the driver needs its device nodes; NCCL needs /dev/shm and abstract sockets
            nccl = getattr(dev, "backend", "") == "nccl"
            devices, writable = ["/dev"], [own, *(["/dev/shm"] if nccl else []), *extra_writable]
            scope_sockets = not nccl
        else:
            devices = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"]
            writable, scope_sockets = [own, *extra_writable], True
        iso["landlock_abi"] = landlock.restrict(
            writable=[w for w in writable if os.path.isdir(w)],
            readable=landlock.default_read_paths() + list(extra_readable), device_rw=devices,
            scope_abstract_sockets=scope_sockets)
        iso["proc_hidden"] = iso["landlock_abi"] > 0
    # NCCL opens its bootstrap and proxy sockets lazily; elsewhere the process group is connected by now.
    allow_sockets = getattr(dev, "backend", "") == "nccl"
    why = seccomp_filter.confine(allow_new_sockets=allow_sockets)
    iso["seccomp"] = why is None
    if why:
        iso["seccomp_error"] = why
    iso["new_sockets"] = allow_sockets
    return iso
