# Walks down the stack from its own frames (sys._getframe, f_back, a traceback's tb_frame) looking for the harness:
# its channel to the coordinator, the seeds and staged inputs of later calls, its timing marks. Candidate code runs
# on a thread of its own, so there must be nothing to find; if anything is found, the submission says so by raising.
import socket
import sys

import torch
import torch.distributed as dist

SUSPECT_NAMES = {"seeds", "staged", "marks", "sock", "spec", "msg"}
SUSPECT_ATTRS = ("sock", "guard", "violations", "run_candidate", "_record", "clock")


def _frames():
    found = []
    f = sys._getframe()
    while f is not None:
        found.append(f)
        f = f.f_back
    try:
        raise ValueError("look down the stack")
    except ValueError as exc:
        f = exc.__traceback__.tb_frame
        while f is not None:
            found.append(f)
            f = f.f_back
    return found


def _harness_in_reach():
    hits = []
    for f in _frames():
        for name, value in f.f_locals.items():
            if name in SUSPECT_NAMES or isinstance(value, socket.socket) \
                    or any(hasattr(value, a) for a in SUSPECT_ATTRS):
                hits.append(f"{f.f_code.co_name}.{name}")
    return hits


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    hits = _harness_in_reach()
    if hits:
        raise RuntimeError(f"reached the harness: {hits}")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    for step in range(1, world):
        buf = torch.empty_like(x)
        reqs = [dist.isend(x, (rank + step) % world), dist.irecv(buf, (rank - step) % world)]
        for r in reqs:
            r.wait()
        out += buf
    return out
