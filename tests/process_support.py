"""Leak checks from /proc: descendants of this process, and processes that name a sandbox folder."""

from __future__ import annotations

import os
import time
from pathlib import Path


def _ppid(pid: str) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name may contain spaces and parentheses


def descendants(root: int | None = None) -> set[int]:
    """Living descendants of `root` (default: this process), zombies excluded."""
    root = root or os.getpid()
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            p = _ppid(d)
            try:
                state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if p is not None and state != "Z":
                parent[int(d)] = p
    out: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {c for c, p in parent.items() if p in frontier} - out
        out |= frontier
    return out


def processes_naming(folders: list[str]) -> list[tuple[int, str]]:
    """Processes whose command line or environment contains one of `folders` (daemonised judge servers and their
    forked ranks are not our descendants, but they carry their sandbox's folder)."""
    needles = [f.encode() for f in folders if f]
    hits = []
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            env = Path(f"/proc/{d}/environ").read_bytes()
        except OSError:
            continue
        if any(n in cmd or n in env for n in needles):
            hits.append((int(d), cmd.replace(b"\0", b" ").decode(errors="replace")[:200]))
    return hits


def wait_until_gone(check, timeout_s: float = 15.0):
    """Poll `check()` (a list of leftovers) until it is empty or the grace period ends; return the last list.
    Servers notice their sandbox is gone within a second, so leftovers after the grace period are leaks."""
    deadline = time.monotonic() + timeout_s
    left = check()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = check()
    return left
