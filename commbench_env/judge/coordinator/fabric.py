"""The CPU ranks' only way to each other: the coordinator carries every message and collective between them.

In `cpu` mode no rank has a socket to another (no gloo, no store; seccomp allows no new sockets), so whatever one
rank learns from another passed through here, in a process the candidate cannot write to. That makes three things
trusted that were not:

- the traffic: bytes are counted as they arrive, so a rank cannot under-report what it sent;
- the rules: an operation a task forbids is refused here, whatever route inside the rank reached it;
- the dependencies: a receive's data is handed over only when the rank waits for it, so what a rank does after a
  wait is all that can depend on the waited data. comm_model.simulate turns each call's log into a modelled time.

Frames are `{"type": "net", "op": ...}` on the rank's own channel, in the order the rank issued them (one channel
per rank, so the order is the rank's program order). Operations (rank -> coordinator):

- `send` {h, to, tag, g} + payload; `recv` {h, from, tag, g, nbytes}: point-to-point, matched per (group, source,
  destination, tag) in order, as MPI and gloo do; sizes must agree;
- `coll` {h, g, kind, ...} + payload: a collective of a group, matched by its number on that group;
- `wait` {h}: answered with the data (receives, collectives); a send's wait is only logged;
- `group` {g, ranks}: a subgroup made by `new_group`; every member must name the same ranks;
- `hbarrier`: the harness's own barrier (outside any call), answered when every rank has joined.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .comm_model import Collective, Event, LinkModel, ModelledCall, Recv, Send, Wait, simulate

WORLD_GROUP = "0"
MAX_BUFFERED = 1 << 30  # bytes sent and not yet received, or given to collectives not yet complete, over all ranks
MAX_GROUPS = 1024

# Collective kind -> the ProcessGroup methods that reach it (a card forbids methods; rules.expand_forbidden).
KIND_METHODS: dict[str, frozenset[str]] = {
    "allreduce": frozenset({"allreduce", "allreduce_coalesced"}),
    "allgather": frozenset({"allgather", "_allgather_base", "all_gather_single", "allgather_into_tensor_coalesced",
                            "allgather_coalesced", "all_gather_single_coalesced"}),
    "reduce_scatter": frozenset({"reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
                                 "reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced"}),
    "alltoall": frozenset({"alltoall", "alltoall_base", "all_to_all_single"}),
    "broadcast": frozenset({"broadcast"}),
    "reduce": frozenset({"reduce"}),
    "gather": frozenset({"gather"}),
    "scatter": frozenset({"scatter"}),
    "barrier": frozenset({"barrier", "monitored_barrier"}),
}
KIND_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reduce_scatter": "reduce_scatter",
              "alltoall": "all_to_all", "broadcast": "broadcast", "reduce": "reduce", "gather": "gather",
              "scatter": "scatter", "barrier": "barrier"}
REDUCE_OPS = ("sum", "product", "min", "max", "band", "bor", "bxor", "avg")


class FabricError(Exception):
    """A rank used the fabric wrongly (sizes that disagree, mismatched collectives, a malformed frame): that
    rank's runtime error. `rule` is set when a task's rule was broken (a forbidden operation)."""

    def __init__(self, rank: int, text: str, rule: str | None = None):
        super().__init__(text)
        self.rank, self.text, self.rule = rank, text, rule


@dataclass
class Message:
    src: int
    dst: int
    tag: int
    group: str
    payload: bytes
    window: int


@dataclass
class Op:
    """One rank's operation, known by its handle until waited for."""
    kind: str  # send | recv | coll
    event: Event | None
    peer: int = -1
    tag: int = 0
    group: str = WORLD_GROUP
    nbytes: int = 0
    msg: int | None = None  # recv: the matched message
    coll: tuple[str, int] | None = None
    result: bytes | None = None
    waiting: bool = False


@dataclass
class CollState:
    kind: str
    members: tuple[int, ...]
    signature: dict[str, Any]
    first: int
    number: int
    joined: dict[int, tuple[int, dict, bytes]] = field(default_factory=dict)  # rank -> (handle, header, payload)
    events: list[Collective] = field(default_factory=list)
    results: dict[int, bytes] | None = None


class Fabric:
    """The switch between one evaluation's CPU ranks."""

    def __init__(self, world: int, model: LinkModel, forbidden_methods: set[str] | frozenset[str] = frozenset(),
                 harness_kinds: set[str] | frozenset[str] = frozenset()):
        """`forbidden_methods`: ProcessGroup methods the card forbids (a kind is refused if any method reaching it
        is); `harness_kinds`: collective kinds the harness itself calls for the candidate, carried regardless."""
        self.world, self.model = world, model
        self.forbidden = frozenset(forbidden_methods)
        self.harness_kinds = frozenset(harness_kinds)
        self.groups: dict[str, tuple[int, ...]] = {WORLD_GROUP: tuple(range(world))}
        self.ops: dict[tuple[int, int], Op] = {}
        self.messages: dict[int, Message] = {}
        self.unmatched_sends: dict[tuple[str, int, int, int], deque[int]] = {}
        self.unmatched_recvs: dict[tuple[str, int, int, int], deque[tuple[int, int]]] = {}
        self.colls: dict[tuple[str, int], CollState] = {}
        self.coll_seq: dict[tuple[str, int], int] = {}
        self.hbarrier: set[int] = set()
        self.buffered = 0
        self.next_msg = self.next_coll = 0
        self.window = 0
        self.logs: list[list[Event]] | None = None

    # ---- modelling windows ----------------------------------------------------------------------------
    def open_window(self) -> None:
        """Start logging a call: from the moment its inputs are released."""
        self.window += 1
        self.logs = [[] for _ in range(self.world)]

    def close_window(self) -> ModelledCall | None:
        logs, self.logs = self.logs, None
        return simulate(logs, self.model) if logs is not None else None

    def _log(self, rank: int, event: Event) -> None:
        if self.logs is not None:
            self.logs[rank].append(event)

    # ---- frames ---------------------------------------------------------------------------------------
    def handle(self, rank: int, header: dict, payload: bytes) -> list[tuple[int, dict, bytes]]:
        """Act on one frame from `rank`; returns the frames to send back, as (rank, header, payload)."""
        op = header.get("op")
        if op == "hbarrier":
            self.hbarrier.add(rank)
            if len(self.hbarrier) < self.world:
                return []
            self.hbarrier.clear()
            return [(r, {"type": "net", "op": "hbarrier"}, b"") for r in range(self.world)]
        if op == "group":
            self._group(rank, header)
            return []
        h = _int(rank, header, "h")
        if op == "wait":
            return self._wait(rank, h)
        if (rank, h) in self.ops:
            raise FabricError(rank, f"rank {rank} reused handle {h} of an operation it has not waited for")
        if op == "send":
            return self._send(rank, h, header, payload)
        if op == "recv":
            self._recv(rank, h, header)
            return []
        if op == "coll":
            return self._collective(rank, h, header, payload)
        raise FabricError(rank, f"rank {rank} sent an unknown fabric operation {op!r}")

    def _members(self, rank: int, group: str) -> tuple[int, ...]:
        members = self.groups.get(group)
        if members is None:
            raise FabricError(rank, f"rank {rank} used group {group!r}, which was never created")
        if rank not in members:
            raise FabricError(rank, f"rank {rank} used group {group!r} of ranks {list(members)}, not its own")
        return members

    def _group(self, rank: int, header: dict) -> None:
        group, ranks = header.get("g"), header.get("ranks")
        if not isinstance(group, str) or len(group) > 64 or len(self.groups) >= MAX_GROUPS:
            raise FabricError(rank, f"rank {rank} made more than {MAX_GROUPS} groups, or one with a malformed name")
        if not isinstance(ranks, list) or not ranks or not all(type(x) is int and 0 <= x < self.world for x in ranks) \
                or len(set(ranks)) != len(ranks) or rank not in ranks:
            raise FabricError(rank, f"rank {rank} made a group of malformed ranks {ranks!r}")
        have = self.groups.get(group)
        if have is None:
            self.groups[group] = tuple(ranks)
        elif have != tuple(ranks):
            raise FabricError(rank, f"new_group mismatch: rank {rank} made group #{group} of ranks {ranks}, another "
                              f"rank made it of {list(have)} (every rank must call new_group in the same order)")

    def _p2p_peer(self, rank: int, header: dict, key: str) -> tuple[str, int, int]:
        group = str(header.get("g", WORLD_GROUP))
        members = self._members(rank, group)
        peer, tag = _int(rank, header, key), _int(rank, header, "tag")
        if peer not in members:
            raise FabricError(rank, f"rank {rank} named rank {peer}, which is not in group {list(members)}")
        if peer == rank:
            raise FabricError(rank, f"rank {rank} tried to {'send to' if key == 'to' else 'receive from'} itself")
        return group, peer, tag

    def _allowed(self, rank: int, methods: frozenset[str], name: str) -> None:
        if methods & self.forbidden:
            raise FabricError(rank, f"rank {rank} called torch.distributed {name}, which this task forbids",
                              rule="forbidden_api")

    def _send(self, rank: int, h: int, header: dict, payload: bytes) -> list[tuple[int, dict, bytes]]:
        self._allowed(rank, frozenset({"send"}), "send / isend")
        group, dst, tag = self._p2p_peer(rank, header, "to")
        if self.buffered + len(payload) > MAX_BUFFERED:
            raise FabricError(rank, f"rank {rank} sent more than {MAX_BUFFERED >> 20} MiB that no rank received")
        msg = self.next_msg
        self.next_msg += 1
        self.messages[msg] = Message(rank, dst, tag, group, payload, self.window)
        self.buffered += len(payload)
        event = Send(handle=h, msg=msg, dst=dst, nbytes=len(payload))
        self._log(rank, event)
        self.ops[(rank, h)] = Op("send", event, peer=dst, tag=tag, group=group, nbytes=len(payload))
        key = (group, rank, dst, tag)
        waiting = self.unmatched_recvs.get(key)
        if waiting:
            return self._match(waiting.popleft(), msg)
        self.unmatched_sends.setdefault(key, deque()).append(msg)
        return []

    def _recv(self, rank: int, h: int, header: dict) -> None:
        self._allowed(rank, frozenset({"recv"}), "recv / irecv")
        group, src, tag = self._p2p_peer(rank, header, "from")
        event = Recv(handle=h, msg=None)
        self._log(rank, event)
        self.ops[(rank, h)] = Op("recv", event, peer=src, tag=tag, group=group, nbytes=_int(rank, header, "nbytes"))
        key = (group, src, rank, tag)
        sent = self.unmatched_sends.get(key)
        if sent:
            self._match((rank, h), sent.popleft())
        else:
            self.unmatched_recvs.setdefault(key, deque()).append((rank, h))

    def _match(self, who: tuple[int, int], msg: int) -> list[tuple[int, dict, bytes]]:
        op, m = self.ops[who], self.messages[msg]
        if op.nbytes != len(m.payload):
            raise FabricError(who[0], f"size mismatch: rank {who[0]} posted a receive of {op.nbytes} bytes from rank "
                              f"{m.src} (tag {m.tag}), which sent {len(m.payload)} bytes")
        op.msg = msg
        if isinstance(op.event, Recv) and m.window == self.window:
            op.event.msg = msg  # a message sent during an earlier call was there before this one began
        return self._deliver(who) if op.waiting else []

    def _wait(self, rank: int, h: int) -> list[tuple[int, dict, bytes]]:
        op = self.ops.get((rank, h))
        if op is None:
            raise FabricError(rank, f"rank {rank} waited for handle {h}, which it never posted")
        self._log(rank, Wait(handle=h))
        if op.kind == "send":
            del self.ops[(rank, h)]
            return []
        op.waiting = True
        if op.kind == "recv" and op.msg is not None or op.kind == "coll" and op.result is not None:
            return self._deliver((rank, h))
        return []

    def _deliver(self, who: tuple[int, int]) -> list[tuple[int, dict, bytes]]:
        op = self.ops.pop(who)
        if op.kind == "recv":
            m = self.messages.pop(op.msg)
            self.buffered -= len(m.payload)
            return [(who[0], {"type": "net", "h": who[1]}, m.payload)]
        return [(who[0], {"type": "net", "h": who[1]}, op.result or b"")]

    # ---- collectives ----------------------------------------------------------------------------------
    def _collective(self, rank: int, h: int, header: dict, payload: bytes) -> list[tuple[int, dict, bytes]]:
        kind = header.get("kind")
        if kind not in KIND_METHODS:
            raise FabricError(rank, f"rank {rank} called an unknown collective {kind!r}")
        if kind not in self.harness_kinds:
            self._allowed(rank, KIND_METHODS[kind], KIND_NAMES[kind])
        group = str(header.get("g", WORLD_GROUP))
        members = self._members(rank, group)
        seq = self.coll_seq.get((group, rank), 0)
        self.coll_seq[(group, rank)] = seq + 1
        signature = _signature(rank, kind, header, members)
        state = self.colls.get((group, seq))
        if state is None:
            state = self.colls[(group, seq)] = CollState(kind, members, signature, rank, self.next_coll)
            self.next_coll += 1
        elif state.kind != kind or state.signature != signature:
            what = "world group" if group == WORLD_GROUP else f"group #{group}"
            raise FabricError(rank, f"mismatched collectives: collective #{seq + 1} on the {what} is "
                              f"{KIND_NAMES[kind]} {_show(signature)} on rank {rank} but "
                              f"{KIND_NAMES[state.kind]} {_show(state.signature)} on rank {state.first}")
        if self.buffered + len(payload) > MAX_BUFFERED:
            raise FabricError(rank, f"rank {rank} has more than {MAX_BUFFERED >> 20} MiB in messages and collectives "
                              "that are not finished")
        self.buffered += len(payload)
        event = Collective(handle=h, coll=state.number, kind=kind,
                           members=members, nbytes=0)
        self._log(rank, event)
        state.events.append(event)
        state.joined[rank] = (h, header, payload)
        self.ops[(rank, h)] = Op("coll", event, group=group, coll=(group, seq))
        if len(state.joined) < len(members):
            return []
        results, nbytes = _run_collective(state)
        self.buffered -= sum(len(p) for _, _, p in state.joined.values())
        for ev in state.events:
            ev.nbytes = nbytes
        del self.colls[(group, seq)]
        out = []
        for r, (hh, _, _) in state.joined.items():
            op = self.ops[(r, hh)]
            op.result = results.get(r, b"")
            if op.waiting:
                out += self._deliver((r, hh))
        return out

    # ---- diagnosis ------------------------------------------------------------------------------------
    def stuck(self, ranks: list[int]) -> list[str]:
        """What each of `ranks` is waiting for, for a deadlock's verdict."""
        lines = []
        for (r, h), op in sorted(self.ops.items()):
            if r not in ranks or not op.waiting:
                continue
            if op.kind == "recv":
                lines.append(f"rank {r} waits for a message from rank {op.peer} (tag {op.tag}, {op.nbytes} bytes)"
                             " that it has not sent")
            elif op.kind == "coll" and op.coll in self.colls:
                st = self.colls[op.coll]
                missing = [m for m in st.members if m not in st.joined]
                lines.append(f"rank {r} waits in {KIND_NAMES[st.kind]} (collective #{op.coll[1] + 1} of its group), "
                             f"which rank(s) {', '.join(map(str, missing))} never joined")
        return lines


def _int(rank: int, header: dict, key: str) -> int:
    v = header.get(key)
    if type(v) is not int or not -(1 << 62) < v < 1 << 62:
        raise FabricError(rank, f"rank {rank} sent a fabric frame whose {key!r} is not an integer")
    return v


_DTYPES = {"float32": ("f", 4), "float64": ("d", 8), "float16": ("e", 2), "bfloat16": (None, 2), "int64": ("q", 8),
           "int32": ("i", 4), "int16": ("h", 2), "int8": ("b", 1), "uint8": ("B", 1), "bool": ("?", 1)}


def _signature(rank: int, kind: str, header: dict, members: tuple[int, ...]) -> dict[str, Any]:
    """What every member of a collective must agree on (checked against the first member's)."""
    sig: dict[str, Any] = {}
    if kind in ("allreduce", "reduce_scatter", "reduce"):
        op = header.get("reduce")
        if op not in REDUCE_OPS:
            raise FabricError(rank, f"rank {rank} asked for an unknown reduction {op!r}")
        sig["reduce"] = op
    if kind not in ("barrier",):
        dtype = header.get("dtype")
        if dtype not in _DTYPES:
            raise FabricError(rank, f"rank {rank} sent a collective of unsupported dtype {dtype!r}")
        sig["dtype"] = dtype
    if kind in ("broadcast", "reduce", "gather", "scatter"):
        root = _int(rank, header, "root")
        if root not in members:
            raise FabricError(rank, f"rank {rank} named root {root}, which is not in group {list(members)}")
        sig["root"] = root
    return sig


def _show(sig: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={v}" for k, v in sig.items()) + ")" if sig else ""


def _run_collective(state: CollState) -> tuple[dict[int, bytes], int]:
    """Every member's result, and the collective's size as nccl-tests counts it (for the cost model)."""
    kind, members, joined = state.kind, state.members, state.joined
    p = len(members)
    data = {r: joined[r][2] for r in members}
    hdr = {r: joined[r][1] for r in members}
    sizes = {r: len(data[r]) for r in members}

    def fail(text: str) -> FabricError:
        return FabricError(state.first, f"{KIND_NAMES[kind]}: {text}")

    if kind == "barrier":
        return {}, 0
    dtype = state.signature["dtype"]
    item = _DTYPES[dtype][1]
    if kind in ("allreduce", "reduce"):
        if len(set(sizes.values())) != 1:
            raise fail(f"the ranks' tensors differ in size: {_sizes(sizes)}")
        total = _reduce([data[r] for r in members], dtype, state.signature["reduce"])
        if kind == "reduce":
            return {state.signature["root"]: total}, sizes[members[0]]
        return {r: total for r in members}, sizes[members[0]]
    if kind == "allgather":
        if len(set(sizes.values())) != 1:
            raise fail(f"the ranks' inputs differ in size: {_sizes(sizes)}")
        joined_bytes = b"".join(data[r] for r in members)
        return {r: joined_bytes for r in members}, len(joined_bytes)
    if kind == "gather":
        if len(set(sizes.values())) != 1:
            raise fail(f"the ranks' inputs differ in size: {_sizes(sizes)}")
        return {state.signature["root"]: b"".join(data[r] for r in members)}, sum(sizes.values())
    if kind == "broadcast":
        root = state.signature["root"]
        if len(set(sizes.values())) != 1:
            raise fail(f"the ranks' tensors differ in size: {_sizes(sizes)}")
        return {r: data[root] for r in members}, sizes[root]
    if kind == "scatter":
        root = state.signature["root"]
        if sizes[root] % (p * item):
            raise fail(f"the root's {sizes[root]} bytes do not split into {p} equal parts")
        n = sizes[root] // p
        return {r: data[root][i * n:(i + 1) * n] for i, r in enumerate(members)}, sizes[root]
    if kind == "reduce_scatter":
        if len(set(sizes.values())) != 1 or sizes[members[0]] % (p * item):
            raise fail(f"every rank must give the same size, a multiple of {p} elements: {_sizes(sizes)}")
        total = _reduce([data[r] for r in members], dtype, state.signature["reduce"])
        n = len(total) // p
        return {r: total[i * n:(i + 1) * n] for i, r in enumerate(members)}, len(total)
    # alltoall: each member names the bytes it sends to each peer (in group order) and expects from each
    splits_in = {r: hdr[r].get("in_bytes") for r in members}
    splits_out = {r: hdr[r].get("out_bytes") for r in members}
    for r in members:
        for s in (splits_in[r], splits_out[r]):
            if not isinstance(s, list) or len(s) != p or not all(type(x) is int and x >= 0 and x % item == 0
                                                                 for x in s):
                raise FabricError(r, f"all_to_all: rank {r} sent malformed split sizes")
        if sum(splits_in[r]) != sizes[r]:
            raise FabricError(r, f"all_to_all: rank {r}'s input splits add up to {sum(splits_in[r])} bytes, "
                              f"its input has {sizes[r]}")
    offsets = {r: [sum(splits_in[r][:j]) for j in range(p)] for r in members}
    results = {}
    for j, dst in enumerate(members):
        parts = []
        for i, src in enumerate(members):
            n = splits_in[src][j]
            if n != splits_out[dst][i]:
                raise FabricError(dst, f"all_to_all split mismatch: rank {src} sends {n // item} elements to rank "
                                  f"{dst}, which expects {splits_out[dst][i] // item} from it")
            parts.append(data[src][offsets[src][j]:offsets[src][j] + n])
        results[dst] = b"".join(parts)
    return results, max(sizes.values())


def _sizes(sizes: dict[int, int]) -> str:
    return ", ".join(f"rank {r}: {n} bytes" for r, n in sizes.items())


def _reduce(parts: list[bytes], dtype: str, op: str) -> bytes:
    """Reduce in rank order, in the tensors' own dtype, as gloo does."""
    import torch

    tdtype = getattr(torch, dtype)
    ts = [torch.frombuffer(bytearray(b), dtype=tdtype) if b else torch.empty(0, dtype=tdtype) for b in parts]
    acc = ts[0].clone()
    for t in ts[1:]:
        if op in ("sum", "avg"):
            acc += t
        elif op == "product":
            acc *= t
        elif op == "min":
            acc = torch.minimum(acc, t)
        elif op == "max":
            acc = torch.maximum(acc, t)
        elif op == "band":
            acc &= t
        elif op == "bor":
            acc |= t
        else:
            acc ^= t
    if op == "avg":
        acc = acc / len(ts) if acc.is_floating_point() else torch.div(acc, len(ts), rounding_mode="floor")
    return acc.contiguous().view(torch.uint8).numpy().tobytes() if acc.numel() else b""

