# Finds the lock the judge waits on in the frame below its own and releases it early, then keeps working for
# 50 ms: a judge that believed the lock would stop the clock before the work is done. The judge waits until the
# candidate thread is idle again, so every call must be timed at 50 ms or more.
import sys
import time

import torch
import torch.distributed as dist


def _release_the_judge():
    f = sys._getframe()
    while f is not None:
        lock = f.f_locals.get("done")
        if lock is not None and hasattr(lock, "release") and lock.locked():
            lock.release()
            return True
        f = f.f_back
    return False


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    _release_the_judge()
    time.sleep(0.05)
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    for step in range(1, world):
        buf = torch.empty_like(x)
        reqs = [dist.isend(x, (rank + step) % world), dist.irecv(buf, (rank - step) % world)]
        for r in reqs:
            r.wait()
        out += buf
    return out
