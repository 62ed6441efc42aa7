"""Turning a freshly forked process into a sandboxed one: own session and folder, output to files, limits,
no inherited descriptors, non-dumpable. Shared by rank processes and the device host."""

from __future__ import annotations

import faulthandler
import os
import resource
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


def set_limits(cpu_s: int, memory_mb: int | None, nofile: int, fsize_mb: int) -> None:
    def setl(which: int, value: int) -> None:
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(which, (value, hard if hard != resource.RLIM_INFINITY else value))
        except (ValueError, OSError):
            pass

    setl(resource.RLIMIT_CPU, cpu_s)
    setl(resource.RLIMIT_NOFILE, nofile)
    setl(resource.RLIMIT_FSIZE, fsize_mb << 20)
    setl(resource.RLIMIT_CORE, 0)
    if memory_mb:
        setl(resource.RLIMIT_AS, memory_mb << 20)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def no_dump() -> None:
    """Make this process non-dumpable: other processes of the same user cannot read its memory through /proc."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:  # noqa: BLE001 - best effort on exotic libcs
        pass


def enter(rdir: Path, keep_fds: tuple[int, ...], *, cpu_s: int, memory_mb: int | None, open_files: int,
          redirect: bool = True) -> None:
    """Call first thing after fork. With `redirect`, stdout/stderr go to rdir/stdout.txt and stderr.txt and every
    descriptor but `keep_fds` is closed; SIGUSR1 dumps the Python stacks to rdir/stack.txt."""
    os.setsid()
    rdir.mkdir(parents=True, exist_ok=True)
    stack = os.open(rdir / "stack.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    if redirect:
        out = os.open(rdir / "stdout.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(rdir / "stderr.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        keep = {0, 1, 2, stack, *keep_fds}
        for fd in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
            if int(fd) not in keep:
                try:
                    os.close(int(fd))
                except OSError:
                    pass
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.chdir(rdir)
    # torch writes caches (the profiler imports inductor) under TMPDIR: keep them in the process's own folder
    for var in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "HOME", "XDG_CACHE_HOME"):
        os.environ[var] = str(rdir)
    import tempfile

    tempfile.tempdir = str(rdir)
    faulthandler.register(signal.SIGUSR1, file=os.fdopen(stack, "w"), all_threads=True)
    set_limits(cpu_s, memory_mb, open_files, 64)
    no_dump()


def run_then_exit(body: Callable[[], None], report: Callable[[str], None] | None = None) -> NoReturn:
    """Run a sandboxed process's body and end it with os._exit: 0 when done, 3 when the coordinator went away,
    2 on an error (printed to stderr and, through `report`, told to the coordinator when it still listens)."""
    code = 0
    try:
        body()
    except EOFError:
        code = 3
    except BaseException as exc:  # noqa: BLE001 - anything, SystemExit included, ends the process here
        traceback.print_exc()
        if report is not None:
            try:
                report(f"{type(exc).__name__}: {exc}")
            except OSError:
                pass
        code = 2
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        os._exit(code)
