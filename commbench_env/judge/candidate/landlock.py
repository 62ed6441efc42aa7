"""Landlock (Linux >= 5.13): an unprivileged file-system sandbox that a rank applies to itself.

After it, the rank can write only inside its own folder and read only system and Python library paths, so ranks
cannot pass data through files (even from C code, where no audit hook sees it) nor read another rank's folder,
the task's files or the repository. On ABI >= 6 it also stops the rank from signalling processes outside it.
Unavailable kernels leave the other layers in place; the judge reports which layers were active.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
from pathlib import Path

_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ABI1_ALL = (1 << 13) - 1
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
READ = EXECUTE | READ_FILE | READ_DIR

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def abi_version() -> int:
    """Landlock ABI of the running kernel; 0 when unavailable."""
    try:
        r = _libc.syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (AttributeError, OSError):
        return 0
    return max(0, int(r))


def _handled(abi: int) -> int:
    bits = _ABI1_ALL
    if abi >= 2:
        bits |= REFER
    if abi >= 3:
        bits |= TRUNCATE
    if abi >= 5:
        bits |= IOCTL_DEV
    return bits


# /proc entries a rank may read besides its own /proc/<pid> (what torch, gloo and the CUDA driver look at). The
# rest of /proc is closed: peers' cmdline, environ, comm and status would be channels between ranks.
PROC_READABLE = ("/proc/cpuinfo", "/proc/meminfo", "/proc/sys", "/proc/filesystems", "/proc/version",
                 "/proc/driver", "/proc/devices")


def _hidden_paths() -> list[Path]:
    """What no rank may read, wherever it sits: the task cards (hidden cases, references) and the sandbox's folder
    (every rank's folder, the judge server's socket)."""
    from ...paths import PACKAGE_DIR, cards_root

    hidden = [cards_root() / "tasks", PACKAGE_DIR / "_cards"]
    if os.environ.get("COMMBENCH_SANDBOX"):
        hidden.append(Path(os.environ["COMMBENCH_SANDBOX"]))
    return [h.resolve() for h in hidden if h.exists()]


def _expand(root: Path, hidden: list[Path]) -> list[str]:
    """`root`, or, where something hidden lies beneath it, its entries apart from the hidden ones (recursively)."""
    inside = [h for h in hidden if h == root or root in h.parents]
    if not inside:
        return [str(root)]
    if any(h == root for h in inside):
        return []
    out: list[str] = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return out
    for entry in entries:
        out += _expand(entry, inside) if entry.is_dir() and not entry.is_symlink() else (
            [] if entry in inside else [str(entry)])
    return out


def default_read_paths() -> list[str]:
    """System and interpreter paths ranks may read: fixed system folders, the interpreter's prefixes and sys.path,
    minus the hidden paths (_hidden_paths) wherever they lie beneath those. A checkout holding this package is
    never taken whole (its runs/ may hold traces), only the package itself."""
    from ...paths import PACKAGE_DIR

    pkg = PACKAGE_DIR  # the commbench_env package
    checkout = pkg.parent if (pkg.parent / "pyproject.toml").exists() or (pkg.parent / ".git").exists() else None
    roots = {"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/opt", "/sys", "/dev",
             sys.prefix, sys.base_prefix, sys.exec_prefix, str(pkg)}
    roots.update(os.path.abspath(p) for p in sys.path if p and os.path.isdir(p))
    hidden = _hidden_paths()
    paths: set[str] = set()
    for r in roots:
        root = Path(r).resolve()
        if root.exists() and root != checkout:
            paths.update(_expand(root, hidden + ([checkout] if checkout and root in checkout.parents else [])))
    paths.add(f"/proc/{os.getpid()}")
    paths.update(p for p in PROC_READABLE if os.path.exists(p))
    return sorted(paths)


def restrict(writable: list[str], readable: list[str], device_rw: list[str] = (),
             scope_abstract_sockets: bool = True) -> int:
    """Apply the rules to this process (and its future children). Returns the ABI used, 0 if not applied."""
    abi = abi_version()
    if abi <= 0:
        return 0
    handled = _handled(abi)
    scoped = ((SCOPE_ABSTRACT_UNIX_SOCKET if scope_abstract_sockets else 0) | SCOPE_SIGNAL) if abi >= 6 else 0
    if abi >= 6:
        attr = struct.pack("=QQQ", handled, 0, scoped)
    elif abi >= 4:
        attr = struct.pack("=QQ", handled, 0)
    else:
        attr = struct.pack("=Q", handled)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _libc.syscall(_SYS_CREATE, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if fd < 0:
        return 0
    try:
        def allow(path: str, access: int) -> None:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                return
            try:
                if not os.path.isdir(path):
                    access &= EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access & handled, pfd), 12)
                _libc.syscall(_SYS_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(_RULE_PATH_BENEATH), rule, ctypes.c_uint32(0))
            finally:
                os.close(pfd)

        for p in readable:
            allow(p, READ)
        for p in device_rw:
            allow(p, READ | WRITE_FILE | IOCTL_DEV)
        for p in writable:
            allow(p, handled)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return 0
        if _libc.syscall(_SYS_RESTRICT, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            return 0
    finally:
        os.close(fd)
    return abi
