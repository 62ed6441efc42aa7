"""The ranks of a `cuda` task: one device-host process runs them all, a host thread and stream per rank.

The device host runs candidate kernels, so it is confined like a torch rank and holds no secret: it learns a
call's seeds only when that call is due and makes the inputs itself. Output shapes come from here (the golden
op's expected outputs), so a hidden case's shapes never reach it before its call.
"""

from __future__ import annotations

import socket
import time

from ...cards import CaseSpec, PerformanceSpec
from ..host.result import RankProfile, SanitizerReport, kernel_bandwidth
from ..protocol import split_inputs
from .host_specs import HOST, host_spec, out_specs, specs_for
from .links import Message, RankFailure
from .rank_group import BenchCalls, Handed, RankGroup
from .timing import bounded_times

class DeviceHostRanks(RankGroup):
    calls_released_singly = True  # flag protocols assume the previous call finished: each call's seeds come when due

    def start(self) -> dict[int, Message]:
        ev = self.ev
        t0 = time.monotonic()
        mine, theirs = socket.socketpair()
        try:
            pid = ev.spawner.spawn("device_host", theirs, world=ev.world, spec=host_spec(ev, ev.timeout_s),
                                   workdir=str(ev.workdir), library=str(ev.library))
        finally:
            theirs.close()
        self.links.add(0, pid, mine)
        ev.timings.launch_s = time.monotonic() - t0
        t0 = time.monotonic()
        msgs = self.links.gather([0], "setup")
        self.links.one("ready")
        ev.timings.load_s = time.monotonic() - t0
        return msgs

    def split(self, msg: Message, case: str) -> list[Handed]:
        """The device host's one message as (outputs, read-only inputs handed back) per rank."""
        per: list[dict] = [dict() for _ in range(self.ev.world)]
        try:
            for key, t in self.links.tensors(0, msg, case, HOST).items():
                r, _, name = key.partition("/")
                per[int(r)][name] = t
        except (ValueError, IndexError) as exc:
            raise RankFailure.protocol(HOST, exc, case) from None
        return [split_inputs(d) for d in per]

    def check_call(self, case: CaseSpec, seeds: list[int], inputs: list[dict]) -> list[Handed]:
        self.links.send(0, {"cmd": "check", "case": case.model_dump(mode="json"), "seeds": seeds,
                            "out_specs": out_specs(self.ev, case, inputs)})
        self.links.release(case.name)
        return self.split(self.links.one("result", case.name), case.name)

    def bench_calls(self, case: CaseSpec, size: int, perf: PerformanceSpec, seeds: list[list[int]]) -> BenchCalls:
        """One call at a time: each call's seeds reach the device host only when it is due. The device host's
        CUDA events time each rank; the coordinator's clock around each call bounds them from below."""
        ev, links, world = self.ev, self.links, self.ev.world
        n_iter = perf.warmup + perf.iters
        links.send(0, {"cmd": "bench", "case": case.model_dump(mode="json"), "calls": n_iter,
                       "out_specs": specs_for(ev, case, [seeds[r][0] for r in range(world)])})
        calls = BenchCalls(times=[[0.0] * perf.iters for _ in range(world)])
        for it in range(n_iter):
            timed = it >= perf.warmup
            links.send(0, {"seeds": [seeds[r][it] for r in range(world)], "sample": timed})
            (t0,) = links.release(case.name)
            header, _ = links.one("done", case.name)
            window = time.perf_counter_ns() - t0
            if not timed:
                continue
            ns = header.get("ns")
            if not isinstance(ns, list) or len(ns) != world:
                raise RankFailure.protocol(HOST, "bad call times", case.name)
            calls.extended += bool(header.get("extended"))
            for r in range(world):  # each rank's one call, bounded by the window around all of them
                (t,), raised = bounded_times(HOST, ns[r:r + 1], 1, window, case.name)
                calls.bounded = calls.bounded or raised
                calls.times[r][it - perf.warmup] = t / 1e3
            links.send(0, ev.sample_ask(size, it))
            for r, handed in enumerate(self.split(links.one("samples", case.name), case.name)):
                calls.samples.append((it, r, handed))
        return calls  # sampled positions are checked against op.expected (custom verifies must keep it right too)

    def profile(self, case: CaseSpec) -> tuple[list[RankProfile], SanitizerReport | None]:
        """GPU kernels of one call, per rank where the device host could tell the ranks' kernels apart, else one
        table of all ranks' kernels (they run in one process) given with rank 0; then ncu on the slowest."""
        from .cuda_tools import ncu_summary

        ev = self.ev
        seeds = [ev.seed("profile", case.name, r) for r in range(ev.world)]
        specs = specs_for(ev, case, seeds)
        self.links.send(0, {"cmd": "profile", "case": case.model_dump(mode="json"), "seeds": seeds,
                            "out_specs": specs})
        h, _ = self.links.one("profile", case.name)
        op_bytes = ev.op.metric_bytes(case, ev.world)
        by_rank = h.get("rows_by_rank")
        profiles = []
        for r in range(ev.world):
            wall = h["ns"][r] / 1e3
            mine = by_rank[r] if by_rank else h["rows"] if r == 0 else []
            rows = kernel_bandwidth(mine, op_bytes, gpu_rows_only=False)
            comm = sum(x["total_us"] for x in rows if x["kind"] == "comm")
            profiles.append(RankProfile(rank=r, case=case.name, wall_us=wall, comm_us=comm,
                                        compute_us=max(0.0, wall - comm), rows=rows,
                                        rows_of_all_ranks=not by_rank and r == 0, rows_of_own_kernels=bool(by_rank)))
        ncu = ncu_summary(ev, case, seeds, specs, h["rows"][0]["name"]) if h["rows"] else None
        return profiles, ncu
