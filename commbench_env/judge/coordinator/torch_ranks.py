"""Torch ranks: one process per rank, forked by the secretless spawner, a torch process group between them.

On the CPU that process group is the coordinator's fabric (fabric.py): ranks have no way to each other but through
the coordinator, which carries, checks and models their traffic. On GPUs it is NCCL (cuda) or gloo (cuda-shared),
and ranks are timed by the clock."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import Any

from ...cards import CaseSpec, PerformanceSpec
from ..host.result import RankProfile, SanitizerReport, kernel_bandwidth
from ..rules import PROCESS_GROUP_COLLECTIVES, PROCESS_GROUP_P2P, expand_forbidden
from .fabric import Fabric
from .links import Message
from .rank_group import BenchCalls, Handed, RankGroup
from .timing import bounded_times


class TorchRanks(RankGroup):
    """CPU (gloo) and GPU (NCCL, or gloo in cuda-shared) ranks of a torch task."""

    def __init__(self, ev):
        super().__init__(ev)
        self.calls_released_singly = ev.req.device_mode == "cpu"
        self.store: Any = None
        if ev.req.device_mode == "cpu":
            _, attrs = expand_forbidden(ev.card.rules.forbidden_apis)
            refused = attrs & (PROCESS_GROUP_COLLECTIVES | PROCESS_GROUP_P2P)
            self.links.fabric = Fabric(ev.world, ev.req.link_model, refused, ev.op.harness_collectives)

    def spec(self) -> dict[str, Any]:
        """What a rank is started with: the card without its cases (a rank learns a case only when it must run
        it), limits, and where the coordinator's rendezvous store listens."""
        ev = self.ev
        spec = {"card": ev.card.model_dump(mode="json"), "timeout_s": ev.timeout_s,
                "memory_mb": ev.req.memory_mb or ev.card.limits.memory_mb,
                "threads_per_rank": ev.req.threads_per_rank or max(1, (os.cpu_count() or 1) // ev.world),
                "landlock": ev.req.landlock, "device_mode": ev.req.device_mode}
        spec["card"]["cases"] = []
        return spec

    def start(self) -> dict[int, Message]:
        import torch.distributed as dist

        ev = self.ev
        t0 = time.monotonic()
        spec = self.spec()
        if self.links.fabric is None:
            # The rendezvous store is served here, by the coordinator: no rank owns it, and it closes once every
            # rank's process group is connected, so ranks cannot use it as a channel.
            self.store = dist.TCPStore("127.0.0.1", 0, ev.world, True, wait_for_workers=False,
                                       timeout=timedelta(seconds=ev.timeout_s))
            spec["store_port"] = self.store.port
        for r in range(ev.world):
            mine, theirs = socket.socketpair()
            try:
                pid = ev.spawner.spawn("rank", theirs, rank=r, world=ev.world, spec=spec, workdir=str(ev.workdir))
            finally:
                theirs.close()
            self.links.add(r, pid, mine)
        ev.timings.launch_s = time.monotonic() - t0

        t0 = time.monotonic()
        msgs = self.links.gather(range(ev.world), "setup")
        if ev.req.device_mode != "cuda":  # NCCL may open communicators later; gloo is connected by now
            self.store = None
        ev.timings.rendezvous_s = max(m[0].get("rendezvous_s", 0.0) for m in msgs.values()) if msgs else 0.0
        self.links.gather(range(ev.world), "ready")
        ev.timings.load_s = time.monotonic() - t0 - ev.timings.rendezvous_s
        return msgs

    def check_call(self, case: CaseSpec, seeds: list[int], inputs: list[dict]) -> list[Handed]:
        links, world = self.links, self.ev.world
        links.send_all(lambda r: {"cmd": "check", "case": case.model_dump(mode="json"), "seed": seeds[r]})
        links.release(case.name)
        msgs = links.gather(range(world), "result", case.name)
        return [links.decode(r, msgs[r], case.name) for r in range(world)]

    def bench_calls(self, case: CaseSpec, size: int, perf: PerformanceSpec, seeds: list[list[int]]) -> BenchCalls:
        full = self.ev.op.verifies_whole_outputs()
        self.links.send_all({"cmd": "bench", "case": case.model_dump(mode="json"), "calls": perf.warmup + perf.iters,
                             "full_outputs": full})
        if self.calls_released_singly:
            calls = self.released(case, size, perf, seeds)
        else:
            calls = self.back_to_back(case, size, perf, seeds)
        calls.full = full
        return calls

    def released(self, case: CaseSpec, size: int, perf: PerformanceSpec, seeds: list[list[int]]) -> BenchCalls:
        """CPU: one call at a time. Each call's seed reaches the ranks only once the previous call's samples are
        in; the coordinator releases all ranks together and times each from its release to the arrival of its
        samples, which it asks for only once the rank says the call returned. So the time covers all the work the
        outputs depend on, and nothing a rank reports about itself is taken as a time."""
        links, world = self.links, self.ev.world
        calls = BenchCalls(times=[[0.0] * perf.iters for _ in range(world)])
        fabric = links.fabric
        for it in range(perf.warmup + perf.iters):
            timed = it >= perf.warmup
            if fabric is not None:  # from the moment the call's inputs exist to its last rank's return
                fabric.open_window()
            links.send_all(lambda r: {"seed": seeds[r][it], "it": it, "sample": timed})
            released = links.release(case.name)
            ends = [0] * world
            ask = self.ev.sample_ask(size, it)

            def then(r: int, msg: Message) -> str | None:
                if msg[0].get("type") == "done":
                    if not timed:
                        return None
                    links.send(r, ask)
                    return "samples"
                ends[r] = time.perf_counter_ns()
                return None

            got = links.gather(range(world), "done", case.name, then=then)
            modelled = fabric.close_window() if fabric is not None else None
            if timed and modelled is not None:
                calls.modelled.append(modelled)
            if timed:
                for r in range(world):
                    calls.times[r][it - perf.warmup] = (ends[r] - released[r]) / 1e3
                    calls.samples.append((it, r, links.decode(r, got[r], case.name)))
        return calls

    def back_to_back(self, case: CaseSpec, size: int, perf: PerformanceSpec, seeds: list[list[int]]) -> BenchCalls:
        """GPU: the warm-up calls, then the timed calls, each phase back-to-back on inputs staged just before it
        (so no warm-up call sees a timed call's inputs). The ranks' CUDA events time each call; the coordinator's
        own clock around the timed phase bounds them from below (timing.bounded_times), since events are read
        inside the candidate's process."""
        links, world, warm = self.links, self.ev.world, perf.warmup
        links.send_all(lambda r: {"seeds": seeds[r][:warm]})
        if warm:
            links.release(case.name)
            links.gather(range(world), "calls", case.name)
        links.send_all(lambda r: {"seeds": seeds[r][warm:], "first": warm})
        released = links.release(case.name)
        ends = [0] * world

        def arrived(r: int, msg: Message) -> None:
            ends[r] = time.perf_counter_ns()

        msgs = links.gather(range(world), "calls", case.name, then=arrived)
        calls = BenchCalls(times=[])
        for r in range(world):
            ns, raised = bounded_times(f"rank {r}", msgs[r][0].get("ns"), perf.iters, ends[r] - released[r], case.name)
            calls.times.append([x / 1e3 for x in ns])
            calls.bounded = calls.bounded or raised
            calls.extended = max(calls.extended, perf.iters if msgs[r][0].get("extended") else 0)
        for i in range(perf.iters):
            it = warm + i
            links.send_all(self.ev.sample_ask(size, it))
            got = links.gather(range(world), "samples", case.name)
            for r in range(world):
                calls.samples.append((it, r, links.decode(r, got[r], case.name)))
        return calls

    def profile(self, case: CaseSpec) -> tuple[list[RankProfile], SanitizerReport | None]:
        ev, links = self.ev, self.links
        seed = ev.seed("profile", case.name)
        links.send_all(lambda r: {"cmd": "profile", "case": case.model_dump(mode="json"), "seed": seed + r * 7919})
        msgs = links.gather(range(ev.world), "profile", case.name)
        profiles = []
        for r in range(ev.world):
            h = msgs[r][0]
            rows = kernel_bandwidth(h["rows"], ev.op.metric_bytes(case, ev.world), gpu_rows_only=True)
            profiles.append(RankProfile(rank=r, case=case.name, wall_us=h["wall_us"], comm_us=h["comm_us"],
                                        compute_us=h["compute_us"], rows=rows))
        return profiles, None
