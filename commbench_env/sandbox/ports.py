"""Fixed TCP ports for sandboxes that need them: a lock file per port (flock, so it dies with its holder) and a
bind test, from a range below the kernel's ephemeral range so that port-0 binds (the judge's rendezvous) never
land on a leased port.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SandboxError
from .gpus import try_lock

LOCK_DIR = Path(os.environ.get("COMMBENCH_PORT_LOCKS", "/tmp/commbench-port-locks"))
RANGE_SIZE = 10000


def default_port_range() -> tuple[int, int]:
    """[start, stop): the RANGE_SIZE ports just below /proc/sys/net/ipv4/ip_local_port_range's first port."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return max(1024, low - RANGE_SIZE), low


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class PortLease:
    ports: list[int]
    _fds: list[int] = field(default_factory=list, repr=False)

    @classmethod
    def acquire(cls, count: int, *, port_range: tuple[int, int] | None = None, lock_dir: Path | None = None,
                timeout_s: float = 60.0) -> PortLease:
        """Hold `count` ports that no other lease (in any process using the same lock folder) holds and that
        nothing on 127.0.0.1 is bound to right now."""
        if count <= 0:
            return cls(ports=[])
        start, stop = port_range or default_port_range()
        if stop - start < count:
            raise SandboxError(f"port range [{start}, {stop}) is smaller than the {count} port(s) asked for")
        d = lock_dir or LOCK_DIR
        d.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        # start somewhere different in each process so concurrent pools rarely contend for the same lock files
        offset = os.getpid() % (stop - start)
        while True:
            lease = cls(ports=[])
            for i in range(stop - start):
                port = start + (offset + i) % (stop - start)
                fd = try_lock(d / f"port{port}.lock")
                if fd is None:
                    continue
                if not _bindable(port):
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)
                    continue
                lease.ports.append(port)
                lease._fds.append(fd)
                if len(lease.ports) == count:
                    return lease
            lease.release()
            if time.monotonic() >= deadline:
                raise SandboxError(f"no {count} free port(s) in [{start}, {stop}) within {timeout_s:.0f} s")
            time.sleep(0.2)

    def release(self) -> None:
        for fd in self._fds:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            except OSError:
                pass
        self._fds = []
