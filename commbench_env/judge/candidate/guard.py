"""Runtime enforcement inside a rank, installed before the candidate is imported.

Two layers behind the static check: tripwires replace forbidden torch.distributed APIs (under every alias the
harness knows), and an audit hook (which Python code cannot remove) refuses files, processes, sockets, shared
memory, ctypes, other threads' frames and swapping an object's class or a function's code to every thread but the
harness's own. Candidate code only ever runs on other threads (candidate_thread.py), so there is no on/off switch
for it to find and flip.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from typing import Any, Callable

from ..rules import PROCESS_GROUP_COLLECTIVES, PROCESS_GROUP_P2P, STATIC_ONLY

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

_BLOCKED_EVENTS = frozenset({
    "os.system", "os.fork", "os.forkpty", "os.kill", "os.killpg", "signal.pthread_kill", "subprocess.Popen",
    "pty.spawn", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
    "os.chmod", "os.chown", "os.chroot", "mmap.__new__", "sys.settrace", "sys.setprofile", "sys.addaudithook",
    "sys._current_frames", "gc.get_referrers", "gc.get_referents", "gc.get_objects", "resource.setrlimit",
    "resource.prlimit", "shutil.copyfile", "shutil.move", "shutil.rmtree", "os.putenv", "os.unsetenv",
    "sys.setrecursionlimit", "os.setsid", "os.setpgid", "sys.setswitchinterval",
})
# attribute writes CPython audits: swapping these would make harness objects run candidate code
_GUARDED_ATTRS = frozenset({"__class__", "__code__", "__bases__", "__defaults__", "__kwdefaults__"})
_BLOCKED_PREFIXES = ("socket.", "ctypes.", "os.exec", "os.spawn", "os.posix_spawn", "_posixshmem.", "winreg.")


class Guard:
    """The rank's violation log: the audit hook, the tripwires and the integrity check write here."""

    def __init__(self) -> None:
        self.violations: list[dict[str, Any]] = []

    def record(self, rule: str, detail: str) -> None:
        if len(self.violations) < 50:
            self.violations.append({"rule": rule, "detail": detail, "where": "runtime"})


def install_audit_hook(guard: Guard, own_pid: int, candidate_module: str) -> None:
    """Refuse the events above on every thread except the caller's (the harness's), from now on."""
    proc_self = (f"/proc/{own_pid}/", "/proc/self/", "/proc/thread-self/")
    harness_thread, get_ident = threading.get_ident(), threading.get_ident
    loaded = frozenset(sys.modules)  # a module imported later may set its own class (torch's config modules do)

    def hook(event: str, args: tuple) -> None:
        if get_ident() == harness_thread:
            return
        reason = None
        if event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            p = str(path) if path is not None else ""
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writing:
                reason = f"opening {p!r} for writing"
            elif p.startswith("/proc/") and not p.startswith(proc_self) and p[6:7].isdigit():
                reason = f"reading another process's {p!r}"
            elif p.startswith("/dev/shm"):
                reason = f"shared memory {p!r}"
        elif event in _BLOCKED_EVENTS or event.startswith(_BLOCKED_PREFIXES):
            reason = event
        elif event == "object.__setattr__" and len(args) > 1 and args[1] in _GUARDED_ATTRS:
            target = args[0]
            owner = target.__name__ if isinstance(target, types.ModuleType) else getattr(target, "__module__", None)
            if owner in loaded and owner != candidate_module:
                reason = f"setting {args[1]} of {type(target).__name__} {getattr(target, '__name__', '?')!r}"
        if reason:
            guard.record("sandbox", f"{reason} is not allowed in candidate code")
            raise PermissionError(f"CommBench: {reason} is not allowed in candidate code")

    sys.addaudithook(hook)


def _tripwire(name: str, guard: Guard) -> Callable[..., Any]:
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        guard.record("forbidden_api", f"{name} was called at run time")
        raise RuntimeError(f"CommBench: {name} is forbidden in this task")

    forbidden.__name__ = name.rsplit(".", 1)[-1]
    return forbidden


def install_tripwires(forbidden: set[str], forbidden_attrs: set[str], guard: Guard) -> None:
    """Replace forbidden functions (torch.save, torch.distributed.all_reduce, ...) and ProcessGroup methods by
    tripwires. torch.save writes through C++, out of the audit hook's sight, so it needs a tripwire of its own."""
    import importlib

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for dotted in forbidden - set(STATIC_ONLY):  # torch's own code calls those: the static check stops them
        module_name, _, leaf = dotted.rpartition(".")
        owners = [dist, c10d] if module_name == "torch.distributed" else []
        if not owners:
            try:
                owners = [importlib.import_module(module_name)]
            except ImportError:
                continue
        for mod in owners:
            if callable(getattr(mod, leaf, None)) and not isinstance(getattr(mod, leaf), type):
                setattr(mod, leaf, _tripwire(dotted, guard))
    pg_attrs = forbidden_attrs & (PROCESS_GROUP_COLLECTIVES | PROCESS_GROUP_P2P | {"get_group_store"})
    for cls in (getattr(dist, "ProcessGroup", None), getattr(c10d, "ProcessGroupGloo", None)):
        if cls is None:
            continue
        for attr in pg_attrs:
            if hasattr(cls, attr):
                try:
                    setattr(cls, attr, _tripwire(f"ProcessGroup.{attr}", guard))
                except (AttributeError, TypeError):
                    pass


class CommProfiler:
    """Per-call timing of torch.distributed functions: wrappers installed once, counting only when enabled."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.enabled = False
        self.clock = clock
        self.stats: dict[str, list[float]] = {}
        self.outer_us = 0.0  # time in outermost calls only (batch_isend_irecv calls isend inside)
        self._depth = 0

    def wrap_module(self) -> None:
        """Wrap in torch.distributed and in distributed_c10d alike: P2POp accepts only the c10d module's isend/irecv."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        names = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "all_reduce", "all_gather",
                 "all_gather_into_tensor", "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
                 "reduce_scatter_single", "all_to_all", "all_to_all_single", "broadcast", "reduce", "gather",
                 "scatter", "barrier", "new_group", "all_gather_object", "broadcast_object_list")
        for n in names:
            fn = getattr(dist, n, None)
            if fn is None:
                continue
            wrapped = self._wrap(f"dist.{n}", fn)
            setattr(dist, n, wrapped)
            if getattr(c10d, n, None) is fn:
                setattr(c10d, n, wrapped)
        work = getattr(dist, "Work", None)  # waiting on an async op is communication time too
        if work is not None:
            try:
                work.wait = self._wrap("Work.wait", work.wait)
            except (AttributeError, TypeError):
                pass

    def _wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        prof = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not prof.enabled:
                return fn(*args, **kwargs)
            t0 = prof.clock()
            prof._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                prof._depth -= 1
                us = (prof.clock() - t0) / 1e3
                prof.stats.setdefault(label, []).append(us)
                if prof._depth == 0:
                    prof.outer_us += us

        timed.__name__ = getattr(fn, "__name__", label)
        timed.__doc__ = getattr(fn, "__doc__", None)
        return timed

    def reset(self) -> None:
        self.stats, self.outer_us, self._depth = {}, 0.0, 0


def monotonic_ns() -> int:
    return time.perf_counter_ns()
