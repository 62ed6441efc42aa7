"""Forbidden collectives refused where the work happens: in torch's dispatcher and on the backend classes.

Every route to a collective through a process group (`dist.all_reduce`, `pg.allreduce`, `torch.ops.c10d.*`,
functional collectives, DTensor, FSDP) ends in one `c10d::` dispatcher op, whatever the names on the way; the
judge registers a kernel for each forbidden op that refuses the call, for every device key it is implemented
for. The only other route, a backend object's own methods (`Backend.allreduce(backend, ...)`, unbound, from any
subclass), is closed by replacing those methods on every backend class. The harness keeps the methods it needs
bound beforehand. Native code inside the rank could still call libtorch directly: that is the residual risk the
trust model names, not something these Python objects pretend to stop.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

# ProcessGroup / Backend method -> the c10d dispatcher ops that carry it.
OPS_OF_METHOD: dict[str, tuple[str, ...]] = {
    "allreduce": ("allreduce_",), "allreduce_coalesced": ("allreduce_coalesced_",),
    "allgather": ("allgather_",), "_allgather_base": ("_allgather_base_",),
    "allgather_coalesced": ("allgather_coalesced_",),
    "allgather_into_tensor_coalesced": ("allgather_into_tensor_coalesced_",),
    "reduce_scatter": ("reduce_scatter_",), "_reduce_scatter_base": ("_reduce_scatter_base_",),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced_",),
    "alltoall": ("alltoall_",), "alltoall_base": ("alltoall_base_",), "broadcast": ("broadcast_",),
    "reduce": ("reduce_",), "gather": ("gather_",), "scatter": ("scatter_",), "barrier": ("barrier",),
    "monitored_barrier": ("monitored_barrier_",), "send": ("send",), "recv": ("recv_",),
    "recv_anysource": ("recv_any_source_",),
}
_KEYS = ("CPU", "CUDA", "PrivateUse1", "SparseCPU", "SparseCUDA")


def _refuse(what: str, record: Callable[[str, str], None]) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        record("forbidden_api", f"called {what}, which this task forbids")
        raise PermissionError(f"{what} is not allowed in this task")
    return kernel


def install(methods: set[str], record: Callable[[str, str], None]) -> list[str]:
    """Refuse the collectives behind `methods` (ProcessGroup method names). Returns the ops guarded. The returned
    registrations live as long as the process (a library object dropped would undo them)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    ops = sorted({op for m in methods for op in OPS_OF_METHOD.get(m, ())})
    lib = torch.library.Library("c10d", "IMPL")  # noqa: TOR901 - an override is the point
    guarded = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        for op in ops:
            name = f"c10d::{op}"
            if not torch._C._dispatch_has_kernel(name):
                continue
            for key in _KEYS:
                if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
                    lib.impl(op, _refuse(f"torch.distributed {op.rstrip('_')}", record), key)
            guarded.append(name)
    _KEEP.append(lib)
    backends = [getattr(torch._C._distributed_c10d, n, None) for n in ("Backend", "ProcessGroupGloo",
                                                                        "ProcessGroupNCCL", "ProcessGroupMPI",
                                                                        "ProcessGroupUCC", "ProcessGroupXCCL")]
    backends += [getattr(c10d, "ProcessGroupGloo", None), getattr(dist, "ProcessGroup", None)]
    for cls in {b for b in backends if b is not None}:
        for m in methods:
            if hasattr(cls, m):
                try:
                    setattr(cls, m, _refuse(f"{cls.__name__}.{m}", record))
                except (AttributeError, TypeError):
                    pass
    return guarded


_KEEP: list[Any] = []
