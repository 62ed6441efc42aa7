"""What candidate code may import and call. Shared by the static check and the runtime guard."""

from __future__ import annotations

ALLOWED_IMPORTS = frozenset({
    "torch", "math", "typing", "dataclasses", "functools", "itertools", "collections", "__future__",
    "operator", "enum", "abc", "numbers", "contextlib", "heapq", "bisect", "statistics",
})

# torch sub-packages that open side channels (files, processes, stores) or reach collectives by the back door.
ALWAYS_FORBIDDEN = (
    "torch.save", "torch.load", "torch.from_file", "torch.multiprocessing", "torch.hub", "torch.package",
    "torch.utils.cpp_extension", "torch.utils.data", "torch.ops", "torch.library", "torch.classes",
    "torch.distributed.TCPStore", "torch.distributed.FileStore", "torch.distributed.HashStore",
    "torch.distributed.PrefixStore", "torch.distributed.Store", "torch.distributed.rpc",
    "torch.distributed.init_process_group", "torch.distributed.destroy_process_group",
    "torch.distributed.elastic", "torch.distributed.launcher", "torch.distributed.run",
    "torch.distributed.checkpoint", "torch.set_default_device",
)
# Making or switching CUDA streams (and graphs, captured on a stream of their own). A torch rank times each call
# between events on its current stream; work on another stream is ordered after neither, so it runs during the
# judge's warm-up or past the stop event (tests/attacks/side_stream.py). Overlap of communication and
# compute needs none of them: `async_op=True` runs NCCL on its own stream, ordered by `wait()`. Static check only:
# torch's own code calls some of these, and a run-time tripwire would blame the candidate for it.
STREAM_APIS = (
    "torch.cuda.Stream", "torch.cuda.ExternalStream", "torch.cuda.streams", "torch.cuda.stream",
    "torch.cuda.StreamContext", "torch.cuda.set_stream", "torch.Stream", "torch.cuda.graph", "torch.cuda.graphs",
    "torch.cuda.CUDAGraph", "torch.cuda.make_graphed_callables", "torch.accelerator.set_stream",
    "torch.get_device_module",
)
# Attribute access by a name in a string: operator.attrgetter("__closure__") reaches what `x.__closure__` would,
# past a check of attribute nodes. Static only, like the stream APIs: torch's own code uses them.
INDIRECT_ACCESS = ("operator.attrgetter", "operator.methodcaller")
STATIC_ONLY = STREAM_APIS + INDIRECT_ACCESS
STREAM_RULE = ("torch tasks run on the current CUDA stream only, the one the judge's clock orders; overlap "
               "communication with compute through async_op=True and wait()")
# Methods that write or map files from C code, where no audit hook sees them.
# get_group_store hands out the rendezvous store: a side channel between ranks.
ALWAYS_FORBIDDEN_ATTRS = frozenset({"share_memory_", "from_file", "untyped_storage", "_storage", "storage",
                                    "tofile", "fromfile", "memmap", "numpy", "get_group_store",
                                    "merge_remote_group"})

_COLLECTIVE_FUNCS = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_gather_coalesced",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast",
    "broadcast_object_list", "reduce", "gather", "gather_object", "scatter", "scatter_object_list",
    "all_reduce_coalesced", "barrier", "monitored_barrier", "all_gather_single", "reduce_scatter_single",
)
# Routes to the same collectives through other packages.
COLLECTIVE_PACKAGES = (
    "torch.distributed.nn", "torch.distributed.tensor", "torch.distributed.device_mesh",
    "torch.distributed.fsdp", "torch.distributed.algorithms", "torch.nn.parallel", "torch.distributed.pipelining",
)
# ProcessGroup methods behind the functions above (pg.allreduce(...)).
PROCESS_GROUP_COLLECTIVES = frozenset({
    "allreduce", "allreduce_coalesced", "allgather", "allgather_coalesced", "allgather_into_tensor_coalesced",
    "reduce_scatter", "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base", "broadcast", "barrier",
    "reduce", "gather", "scatter", "monitored_barrier", "all_gather_single", "all_gather_single_coalesced",
    "all_to_all_single", "reduce_scatter_single", "reduce_scatter_single_coalesced", "_allgather_base",
    "_reduce_scatter_base",
})
PROCESS_GROUP_P2P = frozenset({"send", "recv", "recv_anysource"})
# Method names that also belong to tensors, torch or the standard library (x.gather, functools.reduce): the
# static check cannot tell the owner apart, so only the run-time tripwire on ProcessGroup stops these.
AMBIGUOUS_METHODS = frozenset({"broadcast", "reduce", "gather", "scatter", "send", "recv"})

PRESETS: dict[str, tuple[str, ...]] = {
    "@collectives": tuple(f"torch.distributed.{f}" for f in _COLLECTIVE_FUNCS) + COLLECTIVE_PACKAGES,
    "@p2p": ("torch.distributed.send", "torch.distributed.recv", "torch.distributed.isend",
             "torch.distributed.irecv", "torch.distributed.batch_isend_irecv", "torch.distributed.P2POp",
             "torch.distributed.send_object_list", "torch.distributed.recv_object_list"),
}

FORBIDDEN_BUILTINS = frozenset({
    "open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "breakpoint", "input",
    "setattr", "delattr", "exit", "quit", "help", "memoryview",
})


def normalize(dotted: str) -> str:
    """torch.distributed.distributed_c10d.X and similar aliases are the same API as torch.distributed.X."""
    for alias in ("torch.distributed.distributed_c10d.", "torch.distributed.c10d."):
        if dotted.startswith(alias):
            return "torch.distributed." + dotted[len(alias):]
    return dotted


def expand_forbidden(names: list[str] | tuple[str, ...]) -> tuple[set[str], set[str]]:
    """(dotted names, bare ProcessGroup method names) forbidden by a card, with presets and the fixed list."""
    dotted: set[str] = set(ALWAYS_FORBIDDEN) | set(STATIC_ONLY)
    attrs: set[str] = set(ALWAYS_FORBIDDEN_ATTRS)
    for n in names:
        if n.startswith("@"):
            if n not in PRESETS:
                raise ValueError(f"unknown preset {n!r}; known: {', '.join(PRESETS)}")
            dotted.update(PRESETS[n])
            attrs.update(PROCESS_GROUP_COLLECTIVES if n == "@collectives" else PROCESS_GROUP_P2P)
        else:
            dotted.add(normalize(n))
            leaf = n.rsplit(".", 1)[-1].replace("_", "")
            if n.startswith("torch.distributed."):  # dist.all_reduce -> ProcessGroup.allreduce, and so on
                attrs.update(a for a in PROCESS_GROUP_COLLECTIVES | PROCESS_GROUP_P2P if a.replace("_", "") == leaf)
    return dotted, attrs


def is_forbidden(dotted: str, forbidden: set[str]) -> str | None:
    d = normalize(dotted)
    for f in forbidden:
        if d == f or d.startswith(f + "."):
            return f
    return None
