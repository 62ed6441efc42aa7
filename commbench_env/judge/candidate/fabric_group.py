"""The `commbench` process-group backend of CPU ranks: torch.distributed calls carried by the coordinator.

This code runs in the candidate's process, so it is trusted for nothing: it only turns torch.distributed calls
into fabric frames on the rank's channel (coordinator/fabric.py has the protocol and does the checking, the
matching and the counting). Its own checks are there to give an honest submission a clear error at the line that
caused it: a forbidden operation, a non-contiguous tensor, an operation the fabric does not carry.

Semantics follow gloo's: point-to-point messages match in order per (source, destination, tag); sizes must agree;
collectives reduce in the tensors' own dtype. A receive's data arrives when its work is waited for (`wait()`, or
the blocking forms), never before.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

BACKEND = "commbench"

_REDUCE = {"SUM": "sum", "PRODUCT": "product", "MIN": "min", "MAX": "max", "BAND": "band", "BOR": "bor",
           "BXOR": "bxor", "AVG": "avg"}


def _bytes(t: torch.Tensor, what: str) -> bytes:
    if not t.is_contiguous():
        raise ValueError(f"CommBench: {what} needs contiguous tensors (call .contiguous() first)")
    if t.device.type != "cpu":
        raise ValueError(f"CommBench: {what} on the CPU judge needs CPU tensors, got one on {t.device}")
    return t.detach().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _fill(t: torch.Tensor, blob: bytes, what: str) -> None:
    nbytes = t.numel() * t.element_size()
    if len(blob) != nbytes:
        raise RuntimeError(f"CommBench: {what} returned {len(blob)} bytes into a tensor of {nbytes}")
    if nbytes:
        t.copy_(torch.frombuffer(bytearray(blob), dtype=t.dtype).view(t.shape))


def _same_dtype(tensors: list[torch.Tensor], what: str) -> str:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise ValueError(f"CommBench: {what} needs tensors of one dtype, got {sorted(map(str, dtypes))}")
    return str(tensors[0].dtype).removeprefix("torch.")


def _reduce_name(op: Any) -> str:
    name = getattr(getattr(op, "op", op), "name", str(op))
    if name not in _REDUCE:
        raise ValueError(f"CommBench: reduction {name} is not supported on the CPU judge")
    return _REDUCE[name]


class FabricWork(dist._Work):
    """An operation in flight; `wait()` sends the wait frame and, for receives and collectives, takes the data."""

    def __init__(self, group: "FabricGroup", handle: int, on_data: Callable[[bytes], None] | None,
                 tensors: list[torch.Tensor]):
        super().__init__()
        self._group, self._handle, self._on_data, self._tensors = group, handle, on_data, tensors
        self._done = False

    def wait(self, timeout: Any = None) -> bool:
        if not self._done:
            self._group._finish(self)
            self._done = True
        return True

    def is_completed(self) -> bool:
        """Completes the work first: data reaches a rank only when it asks for it, so a loop that polls until done
        must be a wait (the poll is then where the dependency shows)."""
        self.wait()
        return True

    def is_success(self) -> bool:
        return self._done

    def exception(self) -> Any:
        return None

    def result(self) -> list[torch.Tensor]:
        return self._tensors

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        """A future that is complete once this work has been waited for (here, at once)."""
        self.wait()
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(self._tensors)
        return fut


class _Many(FabricWork):
    """Several fabric operations behind one work (coalesced and list forms)."""

    def __init__(self, group: "FabricGroup", works: list[FabricWork], tensors: list[torch.Tensor],
                 then: Callable[[], None] | None = None):
        super().__init__(group, -1, None, tensors)
        self._works, self._then = works, then

    def wait(self, timeout: Any = None) -> bool:
        if not self._done:
            for w in self._works:
                w.wait()
            if self._then:
                self._then()
            self._done = True
        return True


class FabricGroup(dist.ProcessGroup):
    """One process group (the world, or a subgroup from new_group) over the coordinator's fabric."""

    def __init__(self, channel: Any, handles: Any, rank: int, size: int, ranks: list[int], group_id: str,
                 forbidden: frozenset[str], record: Callable[[str, str], None]):
        super().__init__(rank, size)
        self._channel, self._handles = channel, handles
        self._ranks = list(ranks) if ranks else list(range(size))
        self._gid, self._forbidden, self._record = str(group_id), forbidden, record
        if ranks:  # a subgroup: tell the fabric who is in it
            channel.send({"type": "net", "op": "group", "g": self._gid, "ranks": self._ranks})

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    # ---- plumbing -------------------------------------------------------------------------------------
    def _check(self, method: str, what: str) -> None:
        if method in self._forbidden:
            self._record("forbidden_api", f"{what} was called at run time")
            raise RuntimeError(f"CommBench: {what} is forbidden in this task")

    def _peer(self, group_rank: int) -> int:
        if not 0 <= group_rank < len(self._ranks):
            raise ValueError(f"CommBench: rank {group_rank} is not in this group of {len(self._ranks)} ranks")
        return self._ranks[group_rank]

    def _post(self, header: dict[str, Any], payload: bytes, on_data: Callable[[bytes], None] | None,
              tensors: list[torch.Tensor]) -> FabricWork:
        h = next(self._handles)
        self._channel.send({"type": "net", "h": h, "g": self._gid, **header}, payload)
        return FabricWork(self, h, on_data, tensors)

    def _finish(self, work: FabricWork) -> None:
        self._channel.send({"type": "net", "op": "wait", "h": work._handle})
        if work._on_data is None:
            return
        header, blob = self._channel.recv()
        if header.get("type") != "net" or header.get("h") != work._handle:
            raise RuntimeError("CommBench: the judge's channel is out of step (was torch.distributed used from "
                               "two threads at once?)")
        work._on_data(blob)

    def _coll(self, kind: str, tensors: list[torch.Tensor], payload: bytes, on_data: Callable[[bytes], None],
              **fields: Any) -> FabricWork:
        return self._post({"op": "coll", "kind": kind, **fields}, payload, on_data, tensors)

    # ---- point to point -------------------------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> FabricWork:
        self._check("send", "torch.distributed.send / isend")
        (t,) = tensors
        return self._post({"op": "send", "to": self._peer(dst), "tag": int(tag)}, _bytes(t, "send"), None, tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> FabricWork:
        self._check("recv", "torch.distributed.recv / irecv")
        (t,) = tensors
        if not t.is_contiguous():
            raise ValueError("CommBench: recv needs a contiguous tensor")
        return self._post({"op": "recv", "from": self._peer(src), "tag": int(tag),
                           "nbytes": t.numel() * t.element_size()},
                          b"", lambda blob: _fill(t, blob, "recv"), tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> FabricWork:
        raise NotImplementedError("CommBench: receiving from any source is not supported; name the source rank")

    # ---- collectives ----------------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> FabricWork:
        self._check("allreduce", "torch.distributed.all_reduce")
        (t,) = tensors
        op = _reduce_name(opts.reduceOp) if opts is not None else "sum"
        return self._coll("allreduce", tensors, _bytes(t, "all_reduce"), lambda b: _fill(t, b, "all_reduce"),
                          reduce=op, dtype=_same_dtype([t], "all_reduce"))

    def harness_allreduce(self, t: torch.Tensor) -> FabricWork:
        """The in-place sum the harness hands a candidate in tasks that forbid the rest (golden/utility.py)."""
        return self._coll("allreduce", [t], _bytes(t, "all_reduce"), lambda b: _fill(t, b, "all_reduce"),
                          reduce="sum", dtype=_same_dtype([t], "all_reduce"))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> FabricWork:
        self._check("allreduce_coalesced", "torch.distributed.all_reduce_coalesced")
        flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)

        def spread(blob: bytes) -> None:
            _fill(flat, blob, "all_reduce_coalesced")
            offset = 0
            for t in tensors:
                t.copy_(flat[offset:offset + t.numel()].view(t.shape))
                offset += t.numel()
        op = _reduce_name(opts.reduceOp) if opts is not None else "sum"
        return self._coll("allreduce", tensors, _bytes(flat, "all_reduce_coalesced"), spread, reduce=op,
                          dtype=_same_dtype(tensors, "all_reduce_coalesced"))

    def _gather_into(self, kind: str, method: str, out: torch.Tensor, inp: torch.Tensor, what: str) -> FabricWork:
        self._check(method, what)
        if out.numel() != inp.numel() * len(self._ranks):
            raise ValueError(f"CommBench: {what} needs an output of world x the input's {inp.numel()} elements, "
                             f"got {out.numel()}")
        return self._coll(kind, [out], _bytes(inp, what), lambda b: _fill(out, b, what),
                          dtype=_same_dtype([out, inp], what))

    def _allgather_base(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> FabricWork:
        return self._gather_into("allgather", "_allgather_base", out, inp, "torch.distributed.all_gather_into_tensor")

    def all_gather_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> FabricWork:
        return self._gather_into("allgather", "all_gather_single", out, inp, "torch.distributed.all_gather_single")

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> FabricWork:
        self._check("allgather", "torch.distributed.all_gather")
        (outs,), (inp,) = outputs, inputs
        if len(outs) != len(self._ranks):
            raise ValueError(f"CommBench: all_gather needs a list of {len(self._ranks)} tensors, got {len(outs)}")

        def spread(blob: bytes) -> None:
            n = len(blob) // len(outs)
            for i, t in enumerate(outs):
                _fill(t, blob[i * n:(i + 1) * n], "all_gather")
        return self._coll("allgather", outs, _bytes(inp, "all_gather"), spread,
                          dtype=_same_dtype(outs + [inp], "all_gather"))

    def allgather_into_tensor_coalesced(self, outs: list[torch.Tensor], inps: list[torch.Tensor],
                                        opts: Any = None) -> FabricWork:
        works = [self._gather_into("allgather", "allgather_into_tensor_coalesced", o, i,
                                   "torch.distributed.all_gather_into_tensor") for o, i in zip(outs, inps)]
        return _Many(self, works, outs)

    def _scatter_reduce(self, method: str, out: torch.Tensor, inp: torch.Tensor, opts: Any, what: str) -> FabricWork:
        self._check(method, what)
        if inp.numel() != out.numel() * len(self._ranks):
            raise ValueError(f"CommBench: {what} needs an input of world x the output's {out.numel()} elements, "
                             f"got {inp.numel()}")
        op = _reduce_name(opts.reduceOp) if opts is not None else "sum"
        return self._coll("reduce_scatter", [out], _bytes(inp, what), lambda b: _fill(out, b, what), reduce=op,
                          dtype=_same_dtype([out, inp], what))

    def _reduce_scatter_base(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> FabricWork:
        return self._scatter_reduce("_reduce_scatter_base", out, inp, opts, "torch.distributed.reduce_scatter_tensor")

    def reduce_scatter_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> FabricWork:
        return self._scatter_reduce("reduce_scatter_single", out, inp, opts,
                                    "torch.distributed.reduce_scatter_single")

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> FabricWork:
        (out,), (ins,) = outputs, inputs
        return self._scatter_reduce("reduce_scatter", out, torch.cat([t.reshape(-1) for t in ins]), opts,
                                    "torch.distributed.reduce_scatter")

    def alltoall_base(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int],
                      opts: Any = None) -> FabricWork:
        self._check("alltoall_base", "torch.distributed.all_to_all_single")
        p = len(self._ranks)

        def split_bytes(t: torch.Tensor, splits: list[int], which: str) -> list[int]:
            row = (t.numel() // t.shape[0] if t.dim() and t.shape[0] else 1) * t.element_size()
            if not splits:
                if t.dim() == 0 or t.shape[0] % p:
                    raise ValueError(f"CommBench: all_to_all_single's {which} of {tuple(t.shape)} does not split "
                                     f"into {p} equal parts; give split sizes")
                return [t.shape[0] // p * row] * p
            if len(splits) != p or sum(splits) != t.shape[0]:
                raise ValueError(f"CommBench: all_to_all_single's {which} split sizes {list(splits)} must be {p} "
                                 f"numbers adding up to {t.shape[0]}")
            return [int(s) * row for s in splits]
        return self._coll("alltoall", [out], _bytes(inp, "all_to_all_single"),
                          lambda b: _fill(out, b, "all_to_all_single"), dtype=_same_dtype([out, inp], "all_to_all"),
                          in_bytes=split_bytes(inp, in_splits, "input"), out_bytes=split_bytes(out, out_splits,
                                                                                              "output"))

    all_to_all_single = alltoall_base

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> FabricWork:
        self._check("alltoall", "torch.distributed.all_to_all")

        def spread(blob: bytes) -> None:
            offset = 0
            for t in outputs:
                n = t.numel() * t.element_size()
                _fill(t, blob[offset:offset + n], "all_to_all")
                offset += n
        flat = b"".join(_bytes(t, "all_to_all") for t in inputs)
        return self._coll("alltoall", outputs, flat, spread, dtype=_same_dtype(outputs + inputs, "all_to_all"),
                          in_bytes=[t.numel() * t.element_size() for t in inputs],
                          out_bytes=[t.numel() * t.element_size() for t in outputs])

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> FabricWork:
        self._check("broadcast", "torch.distributed.broadcast")
        (t,) = tensors
        root = self._peer(opts.rootRank if opts is not None else 0)
        return self._coll("broadcast", tensors, _bytes(t, "broadcast"), lambda b: _fill(t, b, "broadcast"),
                          root=root, dtype=_same_dtype([t], "broadcast"))

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> FabricWork:
        self._check("reduce", "torch.distributed.reduce")
        (t,) = tensors
        root = self._peer(opts.rootRank if opts is not None else 0)
        mine = self._ranks[self.rank()] == root
        return self._coll("reduce", tensors, _bytes(t, "reduce"),
                          (lambda b: _fill(t, b, "reduce")) if mine else (lambda b: None),
                          root=root, reduce=_reduce_name(opts.reduceOp) if opts is not None else "sum",
                          dtype=_same_dtype([t], "reduce"))

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> FabricWork:
        self._check("gather", "torch.distributed.gather")
        (inp,) = inputs
        root = self._peer(opts.rootRank if opts is not None else 0)
        outs = outputs[0] if outputs else []

        def spread(blob: bytes) -> None:
            if not outs:
                return
            n = len(blob) // len(outs)
            for i, t in enumerate(outs):
                _fill(t, blob[i * n:(i + 1) * n], "gather")
        return self._coll("gather", outs, _bytes(inp, "gather"), spread, root=root,
                          dtype=_same_dtype([inp], "gather"))

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> FabricWork:
        self._check("scatter", "torch.distributed.scatter")
        (out,) = outputs
        root = self._peer(opts.rootRank if opts is not None else 0)
        payload = b"".join(_bytes(t, "scatter") for t in inputs[0]) if inputs and inputs[0] else b""
        return self._coll("scatter", [out], payload, lambda b: _fill(out, b, "scatter"), root=root,
                          dtype=_same_dtype([out], "scatter"))

    def barrier(self, opts: Any = None) -> FabricWork:
        self._check("barrier", "torch.distributed.barrier")
        return self._coll("barrier", [], b"", lambda b: None)


def register(channel: Any, forbidden: frozenset[str], record: Callable[[str, str], None]) -> None:
    """Make `commbench` a torch.distributed backend whose groups talk over `channel` (the rank's own)."""
    handles = itertools.count(1)

    def create(opts: Any, backend_opts: Any = None) -> FabricGroup:
        return FabricGroup(channel, handles, opts.group_rank, opts.group_size, list(opts.global_ranks_in_group),
                           opts.group_id, forbidden, record)

    dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu"])


def harness_barrier(channel: Any) -> None:
    """The harness's own barrier of every rank (outside any call, never the candidate's traffic)."""
    channel.send({"type": "net", "op": "hbarrier"})
    header, _ = channel.recv()
    if header.get("type") != "net" or header.get("op") != "hbarrier":
        raise RuntimeError("the judge's channel is out of step at the harness barrier")
