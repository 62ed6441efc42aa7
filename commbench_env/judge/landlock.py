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


def default_read_paths() -> list[str]:
    """System and interpreter paths ranks may read: never the repository root or the sandbox folder."""
    pkg = Path(__file__).resolve().parent.parent  # the commbench_env package only
    paths = {"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/opt", "/proc", "/sys", "/dev",
             sys.prefix, sys.base_prefix, sys.exec_prefix, str(pkg)}
    repo_root = str(pkg.parent)
    for p in sys.path:
        if p and os.path.isdir(p) and os.path.abspath(p) != repo_root:
            paths.add(os.path.abspath(p))
    return sorted(p for p in paths if os.path.exists(p))


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
