"""The device host: one process that runs every rank of a `cuda` task, one host thread and stream per rank.

Why one process: kernels that spin on flags written by other ranks only make progress together when they run in
one CUDA context (separate processes on one GPU are time-sliced, about 13 ms per hand-off on an H200), and on
several GPUs one process with peer access gives every rank direct pointers to its peers' buffers without IPC.
The judge owns every buffer (inputs, outputs, scratch, flags) and passes raw pointers through `cb_args`.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from . import isolate
from .confine import confine
from .device import WarmUp, cudart_library, reset_persisting_l2, sleep_cycles, work_outlived_call
from ..protocol import INPUT_PREFIX, Channel, encode_tensors, sample_outputs, sample_together
from ..staging import in_batches

MAX_RANKS, MAX_PARAMS, MAX_AUX = 8, 8, 4
DONE_SPIN_S = 0.005  # the host polls the done events without sleeping this long, so an extended clock stops soon
GATE_HOLD_S = 0.5  # longest the gate waits for every rank's host thread (an entry point that blocks its host)
HOST_THREADS = 8  # torch CPU threads of the device host: it builds every rank's inputs
_P = ctypes.c_void_p
CB_DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int32": 4, "int64": 5, "uint8": 6}


class CbArgs(ctypes.Structure):
    """Mirror of `cb_args` in cuda/commbench.h (same order, natural alignment)."""

    _fields_ = [("rank", ctypes.c_int32), ("world", ctypes.c_int32), ("dtype", ctypes.c_int32),
                ("device", ctypes.c_int32), ("count", ctypes.c_int64), ("out_count", ctypes.c_int64),
                ("in_", _P), ("out", _P), ("scratch", _P), ("scratch_bytes", ctypes.c_int64), ("flags", _P),
                ("flag_words", ctypes.c_int64), ("epoch", ctypes.c_uint32), ("reserved", ctypes.c_int32),
                ("peer_in", _P * MAX_RANKS), ("peer_out", _P * MAX_RANKS), ("peer_scratch", _P * MAX_RANKS),
                ("peer_flags", _P * MAX_RANKS), ("params", ctypes.c_int64 * MAX_PARAMS),
                ("aux_in", _P * MAX_AUX), ("aux_in_count", ctypes.c_int64 * MAX_AUX),
                ("aux_out", _P * MAX_AUX), ("aux_out_count", ctypes.c_int64 * MAX_AUX)]


class HostGate:
    """Holds streams until the host says go: cuStreamWaitValue32 on a word of mapped, pinned host memory.

    Every rank's stream waits on the word before its start event; the host releases it once all ranks' launches
    are queued, so each clock starts with the candidate's work already waiting, whatever the host threads did
    (thread start-up, the GIL, a profiler's callbacks). Where stream memory operations are missing, `hold` says
    so and the caller falls back to a GPU sleep."""

    def __init__(self, cudart: ctypes.CDLL | None):
        self.value = 0
        self.word: ctypes.c_uint32 | None = None
        self._wait = None
        try:
            libcuda = ctypes.CDLL("libcuda.so.1")
            wait = getattr(libcuda, "cuStreamWaitValue32_v2", None) or libcuda.cuStreamWaitValue32
            wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            wait.restype = ctypes.c_int
            host, dev = ctypes.c_void_p(), ctypes.c_uint64()
            # cudaHostAllocPortable | cudaHostAllocMapped: visible to every device's context
            if cudart is None or cudart.cudaHostAlloc(ctypes.byref(host), ctypes.c_size_t(64), 0x1 | 0x2) != 0:
                return
            if cudart.cudaHostGetDevicePointer(ctypes.byref(dev), host, 0) != 0:
                return
            self.word = ctypes.c_uint32.from_address(host.value)
            self.word.value = 0
            self.device_ptr, self._wait = dev.value, wait
        except (OSError, AttributeError):
            self._wait = None

    def arm(self) -> int:
        self.value += 1
        return self.value

    def hold(self, stream_handle: int, value: int) -> bool:
        """Queue 'wait until the word >= value' on a stream; False if the driver refused (no gate then)."""
        if self._wait is None:
            return False
        return self._wait(ctypes.c_void_p(stream_handle), ctypes.c_uint64(self.device_ptr), ctypes.c_uint32(value),
                          0) == 0  # CU_STREAM_WAIT_VALUE_GEQ

    def release(self, value: int) -> None:
        if self.word is not None:
            self.word.value = value


class SyncProbe:
    """Times one GPU's device-wide synchronisation on the host: the one wait that covers every stream, the
    candidate's side streams included. The runtime's own calls are bound when the harness starts, before any
    candidate code exists, and skip torch's Python layers (less host time in what is measured)."""

    def __init__(self, torch: Any, cudart: ctypes.CDLL | None, home: int):
        self._clock, self._home, self._raise = time.perf_counter_ns, home, torch.cuda.synchronize
        if cudart is not None:
            self._set, self._sync = cudart.cudaSetDevice, cudart.cudaDeviceSynchronize
        else:
            self._set, self._sync = torch.cuda.set_device, torch.cuda.synchronize

    def wait_ns(self, device: int) -> int:
        self._set(device)
        t0 = self._clock()
        err = self._sync()
        waited = self._clock() - t0
        if err:  # a kernel fault: let torch raise it with its message
            self._raise(device)
        self._set(self._home)  # the harness's current device, as torch.cuda.synchronize(d) leaves it
        return waited


def peer_links(rank: int, world: int, group: int) -> list[bool]:
    """Which ranks' buffers `rank` may reach: all of them, or with groups of `group` consecutive ranks (a card's
    [cuda] peer_groups) only its own group and its counterparts (same index) in the other groups."""
    if group <= 0:
        return [True] * world
    if world % group:
        raise ValueError(f"peer_groups: a group size of {group} does not divide world {world}")
    return [p // group == rank // group or p % group == rank % group for p in range(world)]


class DeviceHost:
    def __init__(self, world: int, channel: Channel, spec: dict[str, Any], library: str):
        import torch

        from ...golden import get_op

        self.torch, self.world, self.spec = torch, world, spec
        self.channel = channel
        torch.set_num_threads(max(1, min(HOST_THREADS, os.cpu_count() or 1)))
        self.card = spec["card"]
        self.cuda = self.card["cuda"]
        self.op = get_op(self.card["semantics"]["op"])
        mode = spec["device_mode"]
        if not torch.cuda.is_available():
            raise RuntimeError("this cuda task needs a GPU and torch sees none here")
        count = torch.cuda.device_count()
        if mode == "cuda" and world > count:
            raise RuntimeError(f"device mode 'cuda' runs rank r on GPU r: world {world} needs {world} GPUs, found {count}")
        self.devices = list(range(world)) if mode == "cuda" else [0] * world
        self.cudart = cudart_library()
        self.streams = []
        for d in self.devices:
            torch.cuda.set_device(d)
            self.streams.append(self._rank_stream(d))
        self.distinct = sorted(set(self.devices))
        self.legacy = {d: self._legacy_stream(d) for d in self.distinct}
        torch.cuda.set_device(self.distinct[0])
        self.peer_access = self._enable_peer_access()
        self.gate = HostGate(self.cudart)
        self.sync_probe = SyncProbe(torch, self.cudart, self.distinct[0])
        # one harness stream per GPU holds the gate and runs the warm-up; the ranks' streams wait for it
        self.warm_streams, self.warm_ups = {}, {}
        for d in self.distinct:
            with torch.cuda.device(d):
                self.warm_streams[d] = torch.cuda.Stream(device=d)
                self.warm_ups[d] = WarmUp(torch, torch.device("cuda", d))
        self.fallback_cycles = sleep_cycles(torch, self.distinct[0], 2e-3)
        self.library_path = library
        self.rank_libraries: list[str] = []  # copies_for_ranks: one copy of the library per rank
        self.text_symbols: list[int] = []
        self.epoch = 0
        self.extended: list[int] = []  # ranks of the last call whose clock ran on to a device sync
        # COMMBENCH_TIMING_TRACE=FILE appends one JSON line per timed call (times, sync waits): for diagnosis
        trace = os.environ.get("COMMBENCH_TIMING_TRACE")
        self.trace = open(trace, "a", buffering=1) if trace else None  # noqa: SIM115 - lives as long as the host
        self.timeout_s = float(spec["timeout_s"])
        self.t_end = time.monotonic() + self.timeout_s - 5.0  # hung ranks are named before the judge's own limit
        self.call_limit_s = max(2.0, min(30.0, self.timeout_s / 3))
        # bound before the candidate's library loads, so that nothing it does can fool the clock
        ev = torch.cuda.Event
        self._event, self._elapsed, self._sleep = ev, ev.elapsed_time, torch.cuda._sleep
        from . import roofline

        self.roofline = roofline.measure(torch, mode, world, self.distinct)
        self.stop_lag_ns = self._measure_stop_lag()
        torch.cuda.empty_cache()

    def _rank_stream(self, device: int) -> Any:
        """The stream a rank's entry point gets: a *blocking* stream, unlike torch's own. Work a candidate queues
        on the legacy default stream (a launch without a stream argument) then runs after this stream's start
        event and before its done event, so it is timed; on a non-blocking stream it ran at once, while the gate
        held the clock, and a 64 MiB push read 3 us (benchmarks/results/gpu_stream_checks-2026-11-30-2gpu.md)."""
        torch = self.torch
        handle = ctypes.c_void_p()
        if self.cudart is None or self.cudart.cudaStreamCreateWithFlags(ctypes.byref(handle), 0) != 0:  # 0: blocking
            return torch.cuda.Stream(device=device)
        return torch.cuda.ExternalStream(handle.value, device=torch.device("cuda", device))

    def _legacy_stream(self, device: int) -> Any:
        """The device's legacy default stream, which the judge's call marks go on: work on it waits for all earlier
        work on blocking streams, and blocking streams wait for it. The rank streams are blocking, and the
        candidate library's stream creation makes blocking streams only (cuda/blocking_streams.cpp)."""
        torch = self.torch
        stream = torch.cuda.default_stream(device)
        if stream.cuda_stream == 0:  # torch's default stream is the legacy one unless built per-thread
            return stream
        return torch.cuda.ExternalStream(1, device=torch.device("cuda", device))  # cudaStreamLegacy

    def _measure_stop_lag(self, rounds: int = 15) -> dict[int, int]:
        """Per GPU, how much later the legacy-stream stop mark fires than the rank streams' own last done event
        when nothing else runs (the median of `rounds`): the GPU's cross-stream dependency latency, about 3 us on
        an H200 (session 7: every timed call read that much longer with the legacy stop alone). `call_all` takes
        it off the legacy stop, so honest calls keep the time their own stream shows. The rank streams sleep
        while the marks are queued, so that no host time enters the figure."""
        torch = self.torch
        cycles = sleep_cycles(torch, self.distinct[0], 200e-6)
        lags: dict[int, list[int]] = {d: [] for d in self.distinct}
        for _ in range(rounds):
            for d in self.distinct:
                dones = []
                for r in (r for r in range(self.world) if self.devices[r] == d):
                    with torch.cuda.device(d), torch.cuda.stream(self.streams[r]):
                        self._sleep(cycles)
                        dones.append(self._event(enable_timing=True))
                        dones[-1].record(self.streams[r])
                end = self._event(enable_timing=True)
                end.record(self.legacy[d])
                end.synchronize()
                lags[d].append(min(int(self._elapsed(dn, end) * 1e6) for dn in dones))
        return {d: sorted(v)[len(v) // 2] for d, v in lags.items()}

    def _enable_peer_access(self) -> bool:
        distinct = self.distinct
        if len(distinct) < 2:
            return True
        rt = self.cudart
        if rt is None:
            raise RuntimeError("cannot find the CUDA runtime library to enable peer access")
        for a in distinct:
            rt.cudaSetDevice(a)
            for b in distinct:
                if a != b:
                    err = rt.cudaDeviceEnablePeerAccess(b, 0)
                    if err not in (0, 704):  # 704: already enabled
                        raise RuntimeError(f"cudaDeviceEnablePeerAccess({a} -> {b}) failed with error {err}")
        self.torch.cuda.set_device(distinct[0])
        return True

    def copies_for_ranks(self, rdir: Path) -> None:
        """One copy of the candidate's library per rank, loaded apart (RTLD_LOCAL): every rank gets its own host
        statics and its own CUDA module, hence its own `__device__` globals, as if it ran in a process of its own
        (as in `cuda` mode, where each GPU has its own). Otherwise a rank's host code could read a peer's private
        buffer pointers from a static the peer wrote, or ranks could meet in a device global instead of the
        buffers the card gives them. Made before the process is confined; loaded only after."""
        for r in range(self.world):
            dst = rdir / f"candidate-rank{r}.so"
            shutil.copyfile(self.library_path, dst)
            self.rank_libraries.append(str(dst))
        self.text_symbols = _text_symbols(Path(self.library_path))  # nm runs now: no process starts once confined

    def _load_modules(self, path: str) -> None:
        """Load the CUDA module of a copy now, while no kernel is queued: with lazy loading a copy's module would
        load at its first launch, which synchronises the context, so a rank launching behind the start gate
        after a peer had queued its kernel there would block its host thread and the gate would never open.
        cudaFuncGetAttributes on each function of the copy loads the module of those that are kernel stubs (the
        others answer 'invalid device function', which is cleared)."""
        if self.cudart is None or not self.text_symbols:
            return
        base = _load_base(path)
        if base is None:
            return
        attrs = ctypes.create_string_buffer(1024)  # cudaFuncAttributes, with room to spare
        for offset in self.text_symbols:
            self.cudart.cudaFuncGetAttributes(attrs, ctypes.c_void_p(base + offset))
        self.cudart.cudaGetLastError()

    def load(self) -> None:
        entry = self.card["entry"]["functions"][0]
        self.rank_fns = []
        for r, path in enumerate(self.rank_libraries or [self.library_path] * self.world):
            lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
            self.torch.cuda.set_device(self.devices[r])  # a module loads into the current device's context
            self._load_modules(path)
            fns = {}
            for name in self.card["entry"]["functions"]:
                fn = getattr(lib, name)
                fn.argtypes = [ctypes.POINTER(CbArgs), ctypes.c_void_p]
                fn.restype = ctypes.c_int
                fns[name] = fn
            self.rank_fns.append(fns[entry])
        self.torch.cuda.set_device(self.distinct[0])

    # -- buffers -------------------------------------------------------------------------------------
    def host_inputs(self, case, seeds: list[int]) -> list[dict]:
        """Every rank's inputs for one call, made on the CPU from its seed, ranks in parallel (no CUDA work)."""
        return list(in_batches(lambda r: self.op.make_inputs(case, r, self.world, int(seeds[r])), range(self.world)))

    def prepare(self, case, host: list[dict], out_specs: list[dict]) -> list[dict]:
        """Allocate and fill every rank's buffers for one call, from its inputs made by `host_inputs`."""
        torch = self.torch
        from ...golden.base import DTYPE_MAP

        bufs = []
        for r, (host_inputs, dev) in enumerate(zip(host, self.devices)):
            dv = torch.device("cuda", dev)
            inputs = {k: v.to(dv).contiguous() for k, v in host_inputs.items()}
            outs = {}
            for name, meta in out_specs[r].items():
                dt = DTYPE_MAP[meta["dtype"]]
                t = torch.empty(meta["shape"], dtype=dt, device=dv)
                t.fill_(float("nan")) if dt.is_floating_point else t.fill_(-1 if dt != torch.bool else True)
                outs[name] = t
            bufs.append({"inputs": inputs, "outs": outs})
        return bufs

    def scratch_for(self, bufs: list[dict]) -> None:
        torch = self.torch
        c = self.cuda
        for r, b in enumerate(bufs):
            x = b["inputs"][c["input"]]
            nbytes = max(int(c["scratch_bytes"]), int(c["scratch_per_input"] * x.numel() * x.element_size()), 256)
            dv = torch.device("cuda", self.devices[r])
            b["scratch"] = torch.zeros(nbytes, dtype=torch.uint8, device=dv)
            b["flags"] = torch.zeros(int(c["flag_words"]), dtype=torch.int32, device=dv)

    def args_for(self, case, bufs: list[dict]) -> list[CbArgs]:
        c = self.cuda
        out = []
        group = int(case.params.get(c["peer_groups"], 0)) if c.get("peer_groups") else 0
        for r, b in enumerate(bufs):
            a = CbArgs()
            x = b["inputs"][c["input"]]
            y = b["outs"][c["output"]]
            a.rank, a.world, a.device = r, self.world, self.devices[r]
            a.dtype = CB_DTYPES.get(str(x.dtype).removeprefix("torch."), -1)
            a.count, a.out_count = x.numel(), y.numel()
            a.in_, a.out = x.data_ptr(), y.data_ptr()
            a.scratch, a.scratch_bytes = b["scratch"].data_ptr(), b["scratch"].numel()
            a.flags, a.flag_words = b["flags"].data_ptr(), b["flags"].numel()
            shared = set(c.get("peer_buffers", ("in", "out", "scratch", "flags")))
            linked = peer_links(r, self.world, group)
            for p, pb in enumerate(bufs):  # a private buffer of another rank stays NULL (ctypes: None)
                def reach(name: str) -> bool:
                    return p == r or (name in shared and linked[p])
                a.peer_in[p] = pb["inputs"][c["input"]].data_ptr() if reach("in") else None
                a.peer_out[p] = pb["outs"][c["output"]].data_ptr() if reach("out") else None
                a.peer_scratch[p] = pb["scratch"].data_ptr() if reach("scratch") else None
                a.peer_flags[p] = pb["flags"].data_ptr() if reach("flags") else None
            for i, key in enumerate(c["params"][:MAX_PARAMS]):
                a.params[i] = int(case.params.get(key, 0))
            for i, name in enumerate(c["aux_inputs"][:MAX_AUX]):
                a.aux_in[i], a.aux_in_count[i] = b["inputs"][name].data_ptr(), b["inputs"][name].numel()
            for i, name in enumerate(c["aux_outputs"][:MAX_AUX]):
                a.aux_out[i], a.aux_out_count[i] = b["outs"][name].data_ptr(), b["outs"][name].numel()
            out.append(a)
        return out

    # -- one call of every rank, concurrently ------------------------------------------------------------
    def call_all(self, args: list[CbArgs], warm: bool = True) -> list[int]:
        """Returns per-rank ns on the GPU timeline. Raises HungRanks naming the ranks that did not finish.

        Each GPU's harness stream runs the warm-up (see `device.WarmUp`), then waits on the host gate; every
        rank's stream waits for that, and the host threads queue start event, candidate call and done event
        behind it. The gate opens once all threads have returned and every GPU's warm-up has finished (a rank
        that started early would read a peer's memory while that peer still warms up), so all ranks start
        together on busy devices and no host latency is timed (`warm=False` leaves the warm-up out, for the
        profiler's table). The warm-up is queued before the gate on purpose: a torch kernel launched behind a
        closed gate can block its host thread (its module loads lazily), and the gate would never open. The
        previous round is fully finished first (the calling convention promises it). Each GPU's clock stops at a
        mark on its legacy stream queued after all launches, which waits for every stream the call used (see
        `_legacy_stream`); if a device still has work after that (queued later, by a background thread), the
        clock runs on to a device-wide synchronisation."""
        torch = self.torch
        self.epoch += 1
        for a in args:
            a.epoch = self.epoch
        idle_wait = {}
        for d in self.distinct:
            self.sync_probe.wait_ns(d)  # the previous round and this round's staging are finished
            idle_wait[d] = self.sync_probe.wait_ns(d)  # an idle device: what a device sync costs the host right now
            with torch.cuda.device(d):
                reset_persisting_l2(self.cudart)
        world = self.world
        starts = [self._event(enable_timing=True) for _ in range(world)]
        dones = [self._event(enable_timing=True) for _ in range(world)]
        rcs: list[int | None] = [None] * world
        errors: list[str | None] = [None] * world
        ticket = self.gate.arm()
        deadline = min(time.monotonic() + self.call_limit_s, self.t_end)
        ready, warmed = {}, []
        for d in self.distinct:
            ws = self.warm_streams[d]
            with torch.cuda.device(d), torch.cuda.stream(ws):
                if warm:
                    self.warm_ups[d]()
                    warmed.append(self._event())
                    warmed[-1].record(ws)
                if not self.gate.hold(ws.cuda_stream, ticket):
                    self._sleep(self.fallback_cycles)  # no stream memory operations: a GPU sleep instead
                ready[d] = self._event()
                ready[d].record(ws)
            # The legacy stream waits for the gate too: a stream the candidate makes (blocking, see
            # `_legacy_stream`) then cannot start before the clock, whatever it is ordered after.
            self.legacy[d].wait_event(ready[d])

        def run(r: int) -> None:
            try:
                torch.cuda.set_device(self.devices[r])
                s = self.streams[r]
                s.wait_event(ready[self.devices[r]])
                starts[r].record(s)
                rcs[r] = self.rank_fns[r](ctypes.byref(args[r]), ctypes.c_void_p(s.cuda_stream))
                dones[r].record(s)
            except BaseException as exc:  # noqa: BLE001
                errors[r] = f"{type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
        for t in threads:
            t.start()
        hold_until = min(deadline, time.monotonic() + GATE_HOLD_S)
        for t in threads:
            t.join(timeout=max(0.0, hold_until - time.monotonic()))
        ends: dict[int, Any] = {}
        if not any(t.is_alive() for t in threads):
            ends = self._mark_ends()  # before the gate opens: the marks carry no host time
        while not all(e.query() for e in warmed) and time.monotonic() < hold_until:
            pass  # open the gate when every GPU has warmed up: no rank starts beside a peer's warm-up traffic
        self.gate.release(ticket)  # all launches queued (or a host thread is blocked: go anyway)
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        stuck_host = [r for r, t in enumerate(threads) if t.is_alive()]
        if stuck_host:
            raise HungRanks(stuck_host, "did not return from the entry point (host code blocked)")
        ends = ends or self._mark_ends()  # an entry point that blocked its host: its clock ran meanwhile
        for r in range(world):
            if errors[r]:
                raise RuntimeError(f"rank {r}: {errors[r]}")
            if rcs[r] != 0:
                raise RuntimeError(f"rank {r}: the entry point returned {rcs[r]} (non-zero means error)")
        rank_ends = [ends[d] for d in self.devices]  # each rank's GPU's stop mark
        spin_until = time.monotonic() + DONE_SPIN_S
        for events, why in ((dones, "kernels still running at the time limit (a deadlock or a missed flag?)"),
                            (rank_ends, "queued work on another stream that was still running at the time limit")):
            while True:
                pending = [r for r in range(world) if not events[r].query()]
                if not pending:
                    break
                if time.monotonic() > deadline:
                    raise HungRanks(pending, why)
                if time.monotonic() > spin_until:
                    time.sleep(0.0001)
        # Work that outlives the stop marks (queued after them, e.g. by a background thread) counts up to a
        # device-wide sync, told from host noise by `work_outlived_call` against this call's idle sync.
        stops, waits, self.extended = list(rank_ends), {}, []
        for d in self.distinct:
            waits[d] = self.sync_probe.wait_ns(d)  # side streams too: nothing may outlive the clock
            if work_outlived_call(waits[d], idle_wait[d]):
                for r in (r for r in range(world) if self.devices[r] == d):
                    stops[r] = self._event(enable_timing=True)
                    stops[r].record(self.streams[r])  # right after this device's sync: the clock ran to it
                    self.extended.append(r)
        for ev in stops:
            ev.synchronize()
        # A rank's time is its own stream's, plus however much later than all rank streams of its GPU the work
        # on other streams (ones the candidate made) finished: the stop mark's lag past the last done event, less
        # the lag it shows when nothing else runs. Summed per GPU, as one GPU's legacy stream cannot tell whose
        # side stream it waited for (cuda-shared); in `cuda` mode that is max(own, stop - usual lag).
        own = [int(self._elapsed(starts[r], dones[r]) * 1e6) for r in range(world)]
        to_stop = [int(self._elapsed(starts[r], rank_ends[r]) * 1e6) for r in range(world)]
        late = {d: max(0, min(to_stop[r] - own[r] for r in range(world) if self.devices[r] == d) - self.stop_lag_ns[d])
                for d in self.distinct}
        ns = [int(self._elapsed(starts[r], stops[r]) * 1e6) if r in self.extended else own[r] + late[self.devices[r]]
              for r in range(world)]
        if self.trace is not None:
            self.trace.write(json.dumps({"epoch": self.epoch, "ns": ns, "done_ns": own, "stop_ns": to_stop,
                                         "stop_lag_ns": list(self.stop_lag_ns.values()),
                                         "sync_wait_ns": list(waits.values()),
                                         "idle_wait_ns": list(idle_wait.values()), "extended": self.extended}) + "\n")
        return ns

    def _mark_ends(self) -> dict[int, Any]:
        """One stop mark per GPU on its legacy stream: it fires once everything the entry points queued on any
        blocking stream of that GPU has run (each rank's stream and every stream the candidate made), so work on
        a side stream is timed on the GPU's clock, not by a host-timed sync."""
        ends = {}
        for d in self.distinct:
            ends[d] = self._event(enable_timing=True)
            ends[d].record(self.legacy[d])
        return ends

    def outputs(self, bufs: list[dict]) -> dict[str, Any]:
        flat = {}
        for r, b in enumerate(bufs):
            for name, t in b["outs"].items():
                flat[f"{r}/{name}"] = t.detach().cpu()
        return flat

    def shown_inputs(self, bufs: list[dict], sample_seed: int | None = None) -> dict[str, Any]:
        """Every rank's read-only inputs after the call, whole or sampled, for the coordinator to compare with the
        inputs it makes itself (named `r/input:NAME`)."""
        if not self.card["rules"]["inputs_read_only"]:
            return {}
        flat: dict[str, Any] = {}
        for r, b in enumerate(bufs):
            shown = self.op.candidate_inputs(b["inputs"])
            if sample_seed is None:
                flat.update({f"{r}/{INPUT_PREFIX}{k}": v.detach().cpu() for k, v in shown.items()})
            else:
                flat.update(sample_together(shown, sample_seed, prefix=f"{r}/{INPUT_PREFIX}"))
        return flat

    # -- commands ------------------------------------------------------------------------------------
    def send(self, header: dict, blob: bytes = b"") -> None:
        self.channel.send(header, blob)

    def recv(self) -> dict:
        return self.channel.recv()[0]

    def run_check(self, msg: dict, case) -> None:
        bufs = self.prepare(case, self.host_inputs(case, msg["seeds"]), msg["out_specs"])
        self.scratch_for(bufs)
        self.send({"type": "staged"})
        self.recv()  # go
        self.call_all(self.args_for(case, bufs))
        meta, blob = encode_tensors({**self.outputs(bufs), **self.shown_inputs(bufs)})
        self.send({"type": "result", "outputs": meta}, blob)

    def run_bench(self, msg: dict, case) -> None:
        """One call at a time, warm-up calls included, each on inputs whose seeds arrive only when it is due
        (their flag protocols assume the previous call finished, so no call runs ahead of another). Batching the
        warm-up calls' inputs was tried (2026-12-01) and cut fusion/allreduce_residual_rmsnorm's timed figures by
        more than half on the H200; the cause was not found, so every call is staged the same way."""
        scratch_ready = None
        for _ in range(int(msg["calls"])):
            step = self.recv()
            bufs = self.prepare(case, self.host_inputs(case, step["seeds"]), msg["out_specs"])
            if scratch_ready is None:
                self.scratch_for(bufs)
                scratch_ready = [(b["scratch"], b["flags"]) for b in bufs]
            else:
                for b, (sc, fl) in zip(bufs, scratch_ready):
                    b["scratch"], b["flags"] = sc, fl
            self.send({"type": "staged"})
            self.recv()  # go
            ns = self.call_all(self.args_for(case, bufs))
            self.send({"type": "done", "ns": ns, "extended": self.extended})
            if not step.get("sample"):
                continue
            ask = self.recv()  # positions are chosen after the outputs exist
            sampled = {}
            for r, b in enumerate(bufs):
                sampled.update(sample_outputs(b["outs"], ask["sample_seed"], prefix=f"{r}/"))
            sampled.update(self.shown_inputs(bufs, ask["input_seed"]))
            meta, blob = encode_tensors(sampled)
            self.send({"type": "samples", "outputs": meta}, blob)

    def run_profile(self, msg: dict, case) -> None:
        """One warm-up call, then one call under the torch profiler: its GPU kernels, in a table per rank where
        each kernel can be given to a rank (see `kernel_table`), and in one table of every rank's kernels."""
        import torch.profiler as tp

        from .kernel_table import MARKER_UNIT_CYCLES, kernel_records, table, tables_by_rank

        bufs = self.prepare(case, self.host_inputs(case, msg["seeds"]), msg["out_specs"])
        self.scratch_for(bufs)
        self.call_all(self.args_for(case, bufs))
        with tp.profile(activities=[tp.ProfilerActivity.CPU, tp.ProfilerActivity.CUDA]) as prof:
            for r in range(self.world):  # a marker per rank stream, in rank order: see kernel_table
                with self.torch.cuda.device(self.devices[r]), self.torch.cuda.stream(self.streams[r]):
                    self._sleep((r + 1) * MARKER_UNIT_CYCLES)
            ns = self.call_all(self.args_for(case, bufs), warm=False)
        records = kernel_records(prof)
        self.send({"type": "profile", "ns": ns, "rows": table(records),
                   "rows_by_rank": tables_by_rank(records, self.devices)})

    def serve(self) -> None:
        from ...cards import CaseSpec

        while True:
            msg = self.recv()
            cmd = msg.get("cmd")
            if cmd == "exit":
                return
            try:
                case = CaseSpec.model_validate(msg["case"])
                {"check": self.run_check, "bench": self.run_bench, "profile": self.run_profile}[cmd](msg, case)
            except HungRanks as exc:
                self.send({"type": "hung", "ranks": exc.ranks, "error": str(exc)})
            except BaseException as exc:  # noqa: BLE001 - report candidate-caused failures
                self.send({"type": "error", "error": f"{type(exc).__name__}: {exc}"})


def _text_symbols(library: Path) -> list[int]:
    """Offsets of the functions a library defines (its kernels' host stubs among them), from its symbol table."""
    import subprocess

    nm = shutil.which("nm")
    if not nm:
        return []
    out = subprocess.run([nm, "--defined-only", str(library)], capture_output=True, text=True, timeout=60)
    offsets = []
    for ln in out.stdout.splitlines():
        parts = ln.split()
        if len(parts) >= 3 and parts[1] in ("t", "T"):
            try:
                offsets.append(int(parts[0], 16))
            except ValueError:
                continue
    return offsets


def _load_base(path: str) -> int | None:
    """Where the library at `path` was mapped in this process (its first mapping, file offset 0)."""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/maps") as fh:
            for ln in fh:
                f = ln.split()
                if len(f) >= 6 and f[-1] == real and int(f[2], 16) == 0:
                    return int(f[0].split("-")[0], 16)
    except OSError:
        return None
    return None


class HungRanks(Exception):
    def __init__(self, ranks: list[int], why: str):
        super().__init__(f"rank(s) {', '.join(map(str, ranks))} {why}")
        self.ranks = ranks


def _enter_sandbox(rdir: Path, keep_fd: int, spec: dict[str, Any], redirect: bool) -> None:
    """Own session, own folder, limits, non-dumpable; stdout/stderr to files unless a sanitizer reads them."""
    threads = max(1, min(HOST_THREADS, os.cpu_count() or 1))
    # RLIMIT_CPU counts every thread: the limit grows with the threads that build inputs, or a fast many-core
    # machine would SIGKILL the host long before the wall-clock limit
    isolate.enter(rdir, (keep_fd,), cpu_s=(int(spec["timeout_s"]) + 5) * (threads + 1), memory_mb=None,
                  open_files=65536, redirect=redirect)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    # One hardware queue per rank stream: with the default 8 connections, two ranks' streams can share a queue,
    # and work queued behind one rank's spinning kernel would keep another rank's kernel from ever starting.
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")


def _host_loop(world: int, channel: Channel, spec: dict[str, Any], library: str, rdir: Path,
               extra_writable: tuple[str, ...] = (), syscalls: bool = True) -> None:
    """Set up every GPU, confine this process, report, then load the candidate's library and serve."""
    host = DeviceHost(world, channel, spec, library)
    host.copies_for_ranks(rdir)

    class _Dev:  # what confine() asks of a device: a GPU process that needs no new sockets
        is_cuda, backend = True, ""

    iso = {"process": "one device host for all ranks", "landlock_abi": 0, "seccomp": False}
    if syscalls:
        iso.update(confine(spec, _Dev(), rdir, extra_readable=(str(Path(library).parent),),
                           extra_writable=extra_writable))
    else:
        iso["seccomp_error"] = "not applied under an external tool (compute-sanitizer, ncu)"
    host.send({"type": "setup", "rendezvous_s": 0.0, "isolation": iso,
               "device": {"mode": spec["device_mode"], "devices": host.devices,
                          "gpu": host.torch.cuda.get_device_name(0)}, "roofline": host.roofline})
    host.load()  # the candidate's library (and its static initialisers) only inside the sandbox
    host.send({"type": "ready"})
    host.serve()


def device_host_main(world: int, sock: socket.socket, spec: dict[str, Any], workdir: Path, library: str) -> NoReturn:
    """Entry of the forked device-host process. Never returns."""
    channel = Channel(sock)

    def body() -> None:
        rdir = workdir / "rank0"
        _enter_sandbox(rdir, sock.fileno(), spec, redirect=True)
        _host_loop(world, channel, spec, library, rdir)

    isolate.run_then_exit(body, lambda err: channel.send({"type": "load_error", "error": err}))


def main() -> None:
    """`python -m commbench_env.judge.candidate.device_host --fd N --workdir DIR`: a fresh device host, e.g. under
    compute-sanitizer. The first message on the socket carries world, spec and library."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    sock = socket.socket(fileno=a.fd)
    channel = Channel(sock)

    def body() -> None:
        init, _ = channel.recv()
        rdir = Path(a.workdir) / "sanitize"
        _enter_sandbox(rdir, sock.fileno(), init["spec"], redirect=False)
        _host_loop(int(init["world"]), channel, init["spec"], init["library"], rdir, extra_writable=("/tmp",),
                   syscalls=False)

    isolate.run_then_exit(body, lambda err: channel.send({"type": "load_error", "error": err}))


if __name__ == "__main__":
    main()
