"""A seccomp filter (libseccomp, through pyseccomp) that a rank installs on itself before running candidate code.

Why: the audit hook sees only what goes through Python, and Landlock only files. Candidate C code (ctypes, a
compiled extension) can issue any syscall, so the kernel itself refuses the ones that let a rank spawn processes
that outlive it, reach other processes, open new channels to other ranks, or leave the sandbox. The rank sets up
its process group first and confines itself afterwards: connections that exist keep working, new ones are refused.
Everything not listed stays allowed; a denied call fails with EPERM, so the candidate sees an ordinary OSError.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

POLICY = ("seccomp: no fork/exec/new processes (threads only), no ptrace or access to other processes' memory, "
          "signals only to itself, no new sockets, no SysV IPC or message queues, no namespaces/mounts/bpf/"
          "io_uring/keyrings/modules/uid or clock changes, no TIOCSTI")

# Process creation and program loading: nothing may be started, so nothing can outlive the rank (clone: below).
PROCESS_CREATION = ("fork", "vfork", "execve", "execveat")
# Tracing, other processes' memory, descriptors or signals through pidfds; tkill (any thread of any process).
OTHER_PROCESSES = ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd",
                   "pidfd_send_signal", "process_madvise", "process_mrelease", "tkill")
# New channels to other ranks or hosts (socketcall: the 32-bit multiplexer); connected sockets keep working.
NEW_SOCKETS = ("socket", "socketpair", "connect", "bind", "listen", "accept", "accept4", "socketcall")
# Cross-process shared state that needs no file: SysV IPC (ipc: the 32-bit multiplexer) and POSIX message queues.
SYSV_IPC = ("shmget", "shmat", "shmctl", "msgget", "msgsnd", "msgrcv", "semget", "semop", "semtimedop", "ipc",
            "mq_open", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_unlink")
# Kernel attack surface and sandbox escapes: namespaces, mounts, bpf, io_uring (its ops bypass seccomp), keyrings,
# modules, reboot, raw file handles and ports, clocks, host names and credentials.
KERNEL_ESCAPES = (
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
    "fsmount", "fsconfig", "fspick", "mount_setattr", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key", "personality", "init_module",
    "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "syslog",
    "acct", "quotactl", "quotactl_fd", "name_to_handle_at", "open_by_handle_at", "iopl", "ioperm",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "setuid",
    "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid", "setgroups")
# Signals to other processes (kill with pid 0 or < 0 reaches a whole group): allowed only when arg 0 is our pid.
SIGNALS_TO_SELF_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")

_CLONE_THREAD = 0x00010000
# A thread may not be created in new namespaces either (the kernel already requires privileges for most of these).
_CLONE_NEW = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C  # typing into, or driving, the controlling terminal
_PR_SET_NO_NEW_PRIVS, _PR_GET_SECCOMP = 38, 21


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def available() -> str | None:
    """None when confine() can work on this host, else a one-line reason. Never raises.

    The first call imports pyseccomp, whose ctypes.util.find_library runs `ldconfig -p` in a subprocess: make it
    before an audit hook or sandbox refuses subprocesses (confine() itself only needs it to have happened once)."""
    try:
        if platform.system() != "Linux":
            return f"seccomp needs Linux, not {platform.system()}"
        try:
            import pyseccomp
        except ImportError:
            return "pyseccomp is not installed"
        except Exception as e:  # noqa: BLE001 - pyseccomp raises RuntimeError when libseccomp.so is missing
            return f"libseccomp unavailable: {e}"
        if _libc().prctl(_PR_GET_SECCOMP, 0, 0, 0, 0) < 0:
            return "kernel without seccomp (prctl PR_GET_SECCOMP failed)"
        api = pyseccomp.get_api()
        if api < 2:  # level 2: the kernel has seccomp(2) with TSYNC
            return f"libseccomp API level {api}: kernel lacks seccomp(2) with thread sync"
        return None
    except Exception as e:  # noqa: BLE001
        return f"seccomp check failed: {type(e).__name__}: {e}"


def _build(pid: int, allow_new_sockets: bool):  # -> pyseccomp.SyscallFilter
    import pyseccomp as sc

    deny = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, deny)  # int 0x80 / x32 calls would dodge a filter keyed on native numbers
    f.set_attr(sc.Attr.CTL_NNP, 1)
    f.set_attr(sc.Attr.CTL_TSYNC, 1)  # torch, gloo and OpenMP threads already exist: filter them all
    try:
        f.set_attr(sc.Attr.CTL_OPTIMIZE, 2)  # binary tree: fewer BPF instructions per allowed syscall
    except OSError:
        pass

    def rule(action: int, name: str, *args) -> None:
        nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
        if nr < 0:  # unknown to this libseccomp, or absent on this arch (pseudo-syscall numbers are negative)
            return
        try:
            f.add_rule(action, nr, *args)
        except OSError:
            pass  # one syscall the library cannot express must not leave the rank without any filter

    groups = [PROCESS_CREATION, OTHER_PROCESSES, SYSV_IPC, KERNEL_ESCAPES]
    if not allow_new_sockets:
        groups.append(NEW_SOCKETS)
    for name in (n for g in groups for n in g):
        rule(deny, name)
    # ENOSYS, not EPERM: glibc's pthread_create then falls back to clone(2), whose flags the filter can read
    # (clone3 passes them in memory, out of seccomp's reach).
    rule(sc.ERRNO(errno.ENOSYS), "clone3")
    flags = 1 if platform.machine().startswith("s390") else 0  # s390 swaps clone's first two arguments
    rule(deny, "clone", sc.Arg(flags, sc.MASKED_EQ, _CLONE_THREAD, 0))
    for bit in _CLONE_NEW:
        rule(deny, "clone", sc.Arg(flags, sc.MASKED_EQ, bit, bit))
    for name in SIGNALS_TO_SELF_ONLY:
        rule(deny, name, sc.Arg(0, sc.NE, pid))
    for cmd in (_TIOCSTI, _TIOCLINUX):  # the kernel reads cmd as 32 bits: compare only those
        rule(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, cmd))
    return f


def confine(*, allow_new_sockets: bool = False) -> str | None:
    """Install the filter on every thread of this process, for good. None on success, else why not. Never raises.

    allow_new_sockets: keep socket/connect/accept... (NCCL may connect lazily); existing sockets always work."""
    reason = available()
    if reason is not None:
        return reason
    try:
        f = _build(os.getpid(), allow_new_sockets)
        libc = _libc()
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # required to filter without CAP_SYS_ADMIN
            return f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"
        f.load()
    except Exception as e:  # noqa: BLE001
        return f"seccomp filter not installed: {type(e).__name__}: {e}"
    return None
