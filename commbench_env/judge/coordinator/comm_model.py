"""The modelled time of one call: a deterministic alpha-beta simulation of the traffic the coordinator carried.

On CPUs the wall time of a call says nothing about the algorithm (one file's time moved 14.6, 10.0, 8.0 ms over
three runs), so the CPU reward scores this instead: what the same messages, in the same order and with the same
dependencies, would take on a named link model (e.g. one H200's NVLink port through an NVSwitch).

Every rank reaches its peers only through the coordinator (fabric.py), which logs each rank's operations in the
order the rank issued them. Data reaches a rank only when it waits for it, so an operation logged after a wait is
the only kind that can depend on the waited data: the wait is where the dependency shows, and nothing a rank writes
about itself is taken as a time. The simulation is a discrete-event run over those logs:

- each rank has a clock, starting at 0 when the call's inputs are released; posting costs nothing;
- a message from s to d starts at the earliest time from its posting on at which s's egress port and d's ingress
  port are both free for it (one port per direction per rank, full duplex, as each GPU's NVLink port on a switch;
  a message waiting for a busy receiver does not hold the sender's port, so the order of sends to different
  peers matters little), occupies the sender's port for the per-message overhead plus nbytes / bandwidth and the
  receiver's for nbytes / bandwidth, and arrives alpha later;
- a wait moves the rank's clock to the completion of what it waits for;
- a library collective (where the task allows one) starts when its last member joins and its members' ports are
  free, and takes NCCL's ring cost for its kind;
- a rank's call ends when its clock and every transfer it took part in are done; the call's time is the max over
  ranks (as nccl-tests reports).

Local computation is not modelled: the figure is the communication schedule's time. The wall time is still shown.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field

from ..link_model import LinkModel


@dataclass
class Send:
    handle: int
    msg: int  # the coordinator's id of the message
    dst: int
    nbytes: int


@dataclass
class Recv:
    handle: int
    msg: int | None  # filled when the coordinator matches it to a send; None if never matched


@dataclass
class Wait:
    handle: int


@dataclass
class Collective:
    handle: int
    coll: int  # the coordinator's id of the collective instance
    kind: str
    members: tuple[int, ...]
    nbytes: int


Event = Send | Recv | Wait | Collective


@dataclass
class ModelledCall:
    """The modelled time of one call and the traffic it was computed from."""

    time_us: float
    per_rank_us: list[float]
    messages: int
    bytes_moved: int
    collectives: int = 0
    bytes_out: list[int] = field(default_factory=list)
    bytes_in: list[int] = field(default_factory=list)


class Port:
    """A port's calendar: the busy intervals of one direction of one rank's link, kept sorted."""

    def __init__(self) -> None:
        self.busy: list[tuple[float, float]] = []

    def next_free(self, t: float, span: float) -> float:
        """The earliest time >= t from which the port is free for `span`; if it is not free at t, the end of the
        interval in the way (the caller checks again)."""
        i = bisect.bisect_right(self.busy, (t, float("inf"))) - 1
        for start, end in self.busy[max(i, 0):]:
            if start >= t + span:
                break
            if end > t:
                return end
        return t

    def take(self, t: float, span: float) -> None:
        if span > 0:
            bisect.insort(self.busy, (t, t + span))

    def free_from(self) -> float:
        return max((end for _, end in self.busy), default=0.0)


def _earliest(ports: list[tuple[Port, float]], t: float) -> float:
    """The earliest time >= t at which every (port, span) is free for its span."""
    while True:
        moved = max(port.next_free(t, span) for port, span in ports)
        if moved <= t:
            return t
        t = moved


def simulate(logs: list[list[Event]], model: LinkModel) -> ModelledCall:
    """Run the logs of one call (logs[rank], in issue order) on `model`. Deterministic: the same logs give the
    same figure, whatever order the coordinator saw the ranks' frames in. Ranks run in the order of their clocks
    (ties by a counter), so messages take the ports in the order they were posted."""
    world = len(logs)
    egress, ingress = [Port() for _ in range(world)], [Port() for _ in range(world)]
    finish: dict[tuple[int, int], float] = {}  # (rank, handle) -> completion of that operation
    last = [0.0] * world  # the latest completion of anything a rank took part in
    recv_of: dict[int, tuple[int, int]] = {}  # message -> (rank, handle) of its receive
    msg_of: dict[tuple[int, int], int | None] = {}  # (rank, handle) of a receive -> its message
    coll_members: dict[int, list[tuple[int, int, float]]] = {}  # collective -> (rank, handle, join time)
    bytes_out, bytes_in = [0] * world, [0] * world
    messages = collectives = 0
    for r, log in enumerate(logs):
        for ev in log:
            if isinstance(ev, Recv):
                msg_of[(r, ev.handle)] = ev.msg
                if ev.msg is not None:
                    recv_of[ev.msg] = (r, ev.handle)

    clock, pos = [0.0] * world, [0] * world
    blocked: dict[int, tuple[int, int]] = {}  # rank -> the operation it waits for
    heap: list[tuple[float, int, int]] = []
    tick = 0

    def run_at(r: int, at: float) -> None:
        nonlocal tick
        clock[r] = max(clock[r], at)
        heapq.heappush(heap, (clock[r], tick, r))
        tick += 1

    def completed(key: tuple[int, int], at: float) -> None:
        finish[key] = at
        last[key[0]] = max(last[key[0]], at)
        if blocked.get(key[0]) == key:
            del blocked[key[0]]
            run_at(key[0], at)

    for r in range(world):
        run_at(r, 0.0)
    while heap:
        _, _, r = heapq.heappop(heap)
        log = logs[r]
        while pos[r] < len(log):
            ev, now = log[pos[r]], clock[r]
            if isinstance(ev, Send):
                busy = model.transfer_us(ev.nbytes)
                out = busy + model.overhead_us
                start = _earliest([(egress[r], out), (ingress[ev.dst], busy)], now)
                egress[r].take(start, out)
                ingress[ev.dst].take(start, busy)
                done = start + out + model.alpha_us
                completed((r, ev.handle), done)
                if ev.msg in recv_of:
                    completed(recv_of[ev.msg], done)
                bytes_out[r] += ev.nbytes
                bytes_in[ev.dst] += ev.nbytes
                messages += 1
            elif isinstance(ev, Recv):
                if ev.msg is None:  # never matched in this call: nothing it waits for can come from this call
                    completed((r, ev.handle), 0.0)
            elif isinstance(ev, Collective):
                joined = coll_members.setdefault(ev.coll, [])
                joined.append((r, ev.handle, now))
                if len(joined) == len(ev.members):
                    start = max([j[2] for j in joined] + [max(egress[m].free_from(), ingress[m].free_from())
                                                          for m in ev.members])
                    done = start + model.collective_us(ev.kind, len(ev.members), ev.nbytes)
                    for m in ev.members:  # a library collective holds its members' ports throughout
                        egress[m].take(start, done - start)
                        ingress[m].take(start, done - start)
                    for rr, hh, _ in joined:
                        completed((rr, hh), done)
                    collectives += 1
            elif isinstance(ev, Wait):
                key = (r, ev.handle)
                if key not in finish:
                    blocked[r] = key  # resumed by completed()
                    pos[r] += 1
                    break
                if finish[key] > now:  # let every rank whose clock is behind go first
                    pos[r] += 1
                    run_at(r, finish[key])
                    break
            pos[r] += 1
    per_rank = [max(clock[r], last[r]) for r in range(world)]
    return ModelledCall(time_us=max(per_rank, default=0.0), per_rank_us=per_rank, messages=messages,
                        bytes_moved=sum(bytes_out), collectives=collectives, bytes_out=bytes_out, bytes_in=bytes_in)
