# Attaches finalizers to the tensors it is handed and hands back (weakref callbacks, an object with __del__, a
# garbage cycle): if the harness freed them on its own thread, candidate code would run there, outside the
# sandbox. The judge frees them on the candidate thread and collects garbage only there; each finalizer prints
# where it ran.
import threading
import weakref

import torch
import torch.distributed as dist


def _where(tag):
    side = "HARNESS THREAD" if threading.current_thread() is threading.main_thread() else "candidate thread"
    print(f"finalizer {tag} ran on the {side}", flush=True)


class _Trap:
    def __init__(self, tag):
        self.tag = tag

    def __del__(self):
        _where(self.tag)


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    weakref.finalize(x, _where, "weakref-input")
    cycle = _Trap("cycle")
    cycle.me = cycle
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    for step in range(1, world):
        buf = torch.empty_like(x)
        reqs = [dist.isend(x, (rank + step) % world), dist.irecv(buf, (rank - step) % world)]
        for r in reqs:
            r.wait()
        out += buf
    out.trap = _Trap("__del__-output")
    weakref.finalize(out, _where, "weakref-output")
    return out
