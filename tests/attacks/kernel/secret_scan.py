# Class 1 (secrets in candidate memory): scans its own address space through /proc/self/mem for the evaluation's
# secret and hidden cases, as they would sit in a process forked from the coordinator. With them it could make every
# peer's inputs and skip communication. Ranks now start from a spawner forked before the request was read: nothing
# is found, and the local-only answer it falls back on is wrong.
import re

import torch

# (written with \s* so that this file's own text in memory does not match) the request's secret; a card with its cases (the rank's copy has none); a hidden case (none is due at the first
# call, which runs a visible case)
PATTERNS = (rb'"secret"\s*:\s*"[0-9a-f]{32}', rb'"cases"\s*:\s*\[\s*\{', rb'"visible"\s*:\s*false')
_calls = []


def _scan() -> list[bytes]:
    found = []
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", buffering=0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if "r" not in perms or "[vvar" in line or "[vsyscall" in line:
                continue
            lo, hi = (int(x, 16) for x in span.split("-"))
            if hi - lo > 1 << 30:
                continue
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except OSError:
                continue
            for pat in PATTERNS:
                m = re.search(pat, data)
                if m:
                    found.append(data[max(0, m.start() - 150):m.end() + 60])
    return found


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if not _calls:
        for hit in _scan():
            print("LEAKED", hit[:200])
    _calls.append(1)
    return x.clone()
