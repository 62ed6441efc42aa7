"""The rank harness: one forked process per rank. It owns the process group, inputs, timing and the channel to
the coordinator; the candidate module is loaded only after all of that is captured and guarded."""

from __future__ import annotations

import functools
import gc
import linecache
import os
import socket
import types
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, NoReturn

from . import candidate_thread, dispatch_guard, integrity, isolate
from .candidate_thread import CandidateRaised, candidate_traceback
from .confine import confine
from .device import RankDevice
from .guard import CommProfiler, Guard, install_audit_hook, install_tripwires
from ..protocol import INPUT_PREFIX, Channel, encode_tensors, sample_outputs, sample_together
from ..rules import PROCESS_GROUP_COLLECTIVES, PROCESS_GROUP_P2P, expand_forbidden



def _load_module(code: types.CodeType, namespace: dict[str, Any], names: tuple[str, ...], filename: str) -> dict:
    """Run on the candidate thread: execute the module, then pick its entry points (the namespace is the candidate's,
    so even looking names up in it happens there)."""
    exec(code, namespace)  # noqa: S102 - this is the sandboxed candidate thread
    fns = {}
    for name in names:
        fn = namespace.get(name)
        if not callable(fn):
            raise LookupError(f"{filename} does not define a function named {name!r}")
        fns[name] = fn
    return fns


def _profiled(call: Callable[[], Any], activities: list) -> Any:
    """Run on the candidate thread: the torch profiler records CPU ops only on the thread that starts it."""
    import torch.profiler as tp

    with tp.profile(activities=activities) as prof:
        call()
    return prof


def _prepare_thread(torch: Any, threads: int, device: Any) -> None:
    """Run first on the candidate thread: the intra-op thread count and the current GPU, both kept per thread.
    Without set_num_threads here, fusion/allgather_matmul's calls took 0.55 s instead of 0.19 s at world 2 on two
    cores (torch.get_num_threads() read the same in both cases; `benchmarks/throughput.py` shows the effect)."""
    torch.set_num_threads(threads)
    if device is not None:
        torch.cuda.set_device(device)


def _release(graveyard: list) -> None:
    """Run on the candidate thread: drop everything the candidate was handed or handed back, and collect the young
    garbage, so that a finalizer it attached (`__del__`, a weakref callback) runs there, never on the harness's."""
    graveyard.clear()
    gc.collect(0)


def _settler(snapshot: list[Callable[[], list[str]]], record: Callable[[str, str], None]) -> Callable[[], None]:
    """`settle` for candidate_thread.start: restore the namespaces first, only then log what was changed (`record`
    is the guard's, bound before any candidate code exists). `snapshot[0]` is the current snapshot's restore; the
    harness retakes it after its own work changed them."""
    gc_disable = gc.disable

    def settle() -> None:
        gc_disable()  # the collector would run candidate finalizers on whichever thread allocates
        for what in snapshot[0]():
            record("sandbox", f"the submission replaced {what}; the judge put it back")
    return settle


class RankHarness:
    def __init__(self, rank: int, world: int, sock: socket.socket, spec: dict[str, Any], workdir: Path):
        self.rank, self.world, self.spec, self.workdir = rank, world, spec, workdir
        self.channel = Channel(sock)
        self.card = spec["card"]
        self.guard = Guard()

    def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        self.channel.send(header, blob)

    def recv(self) -> dict[str, Any]:
        return self.channel.recv()[0]

    # -- set-up, all before the candidate exists ------------------------------------------------------
    def setup(self) -> None:
        import time

        import torch
        import torch.distributed as dist

        from ...golden import get_op
        from . import fabric_group  # imports torch.distributed

        self.torch, self.dist = torch, dist
        self.clock = time.perf_counter_ns
        self.op = get_op(self.card["semantics"]["op"])
        threads = max(1, int(self.spec.get("threads_per_rank", 1)))
        torch.set_num_threads(threads)
        self.dev = RankDevice(self.spec.get("device_mode", "cpu"), self.rank, self.world)
        self.roofline = None
        if self.rank == 0 and self.dev.is_cuda:  # measured before the candidate exists, on the rank's own GPUs
            from . import roofline

            gpus = list(range(self.world)) if self.dev.mode == "cuda" else [self.dev.device.index]
            self.roofline = roofline.measure(torch, self.dev.mode, self.world, gpus)
            torch.cuda.empty_cache()
        timeout = timedelta(seconds=float(self.spec["timeout_s"]))
        forbidden, attrs = expand_forbidden(self.card["rules"]["forbidden_apis"])
        t0 = self.clock()
        if self.dev.backend == fabric_group.BACKEND:
            # CPU ranks reach each other only through the coordinator, on this rank's own channel: no store, no
            # sockets between ranks. The harness's barrier is the coordinator's too, outside every call.
            fabric_group.register(self.channel, frozenset(attrs), self.guard.record)
            dist.init_process_group(fabric_group.BACKEND, store=dist.HashStore(), rank=self.rank,
                                    world_size=self.world, timeout=timeout)
            self.barrier = functools.partial(fabric_group.harness_barrier, self.channel)
        else:
            # The store's server is the coordinator's: no rank owns the rendezvous, and it closes once all are set up.
            store = dist.TCPStore("127.0.0.1", int(self.spec["store_port"]), self.world, False, timeout=timeout)
            extra = {"device_id": self.dev.device} if self.dev.backend == "nccl" else {}
            dist.init_process_group(self.dev.backend, store=store, rank=self.rank, world_size=self.world,
                                    timeout=timeout, **extra)
            del store
            # The harness synchronises on a group of its own, through its backend's own method, bound before any
            # guard exists: neither the candidate's traffic nor a forbidden-collective guard touches it.
            self.dev.bind_group(dist.group.WORLD)
            harness_group = dist.new_group(backend="gloo")
            bound_barrier = harness_group._get_backend(self.torch.device("cpu")).barrier
            self.barrier = lambda: bound_barrier().wait()
        self.barrier()
        self.rendezvous_s = (self.clock() - t0) / 1e9
        # read before the file-system sandbox closes the evaluation folder to this process
        self.source = (self.workdir / "candidate" / self.card["entry"]["file"]).read_text()
        install_tripwires(forbidden, attrs, self.guard)
        self.guarded_ops = dispatch_guard.install(attrs & (PROCESS_GROUP_COLLECTIVES | PROCESS_GROUP_P2P),
                                                  self.guard.record)
        self.profiler = CommProfiler(self.clock)
        self.profiler.wrap_module()
        self.isolation = {"audit_hook": True, "tripwires": True, **confine(self.spec, self.dev)}
        self.isolation["dispatch_guard"] = bool(self.guarded_ops) or not (attrs & PROCESS_GROUP_COLLECTIVES)
        self.send({"type": "setup", "rendezvous_s": self.rendezvous_s, "isolation": self.isolation,
                   "device": self.dev.describe(), "roofline": self.roofline})
        import torch.profiler as tp

        # Every object the candidate is handed or hands back goes here as soon as it exists and is dropped on the
        # candidate thread after each command (_release): the harness's thread never frees one. The collector is
        # off for the same reason; _release collects.
        self.graveyard: list = []
        gc.disable()
        self.snapshot = [integrity.snapshot()]
        self.settle = settle = _settler(self.snapshot, self.guard.record)
        filename = self.card["entry"]["file"]
        install_audit_hook(self.guard, os.getpid(), Path(filename).stem)
        self.run_candidate = candidate_thread.start(filename, settle, functools.partial(
            _prepare_thread, torch, threads, self.dev.device if self.dev.is_cuda else None))

    def load_candidate(self) -> None:
        entry = self.card["entry"]
        filename = entry["file"]
        self.filename = filename
        source = self.source
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # source lines in tracebacks
        module = types.ModuleType(Path(filename).stem)
        module.__file__ = filename
        code = compile(source, filename, "exec")
        try:
            fns = self.run_candidate(functools.partial(_load_module, code, module.__dict__, tuple(entry["functions"]),
                                                       filename))
            self.settle()
        except CandidateRaised as exc:
            if exc.denied:
                self.guard.record("sandbox", f"access denied by the sandbox: {exc.text.splitlines()[-1]}")
            raise
        finally:
            self.module = module  # kept for the process's life: it must not be freed on this thread
        if type(fns) is not dict or not all(type(k) is str and callable(v) for k, v in fns.items()):
            self.bury(fns)
            raise RuntimeError("the submission's module did not hand back plain functions")
        self.fns = fns

    # -- running --------------------------------------------------------------------------------------
    def bury(self, obj: Any) -> Any:
        """Keep `obj` until the next `release`, which frees it on the candidate thread; returns `obj`."""
        self.graveyard.append(obj)
        return obj

    def release(self) -> None:
        if self.graveyard:
            self.run_candidate(functools.partial(_release, self.graveyard))
            self.settle()

    def _case(self, d: dict[str, Any]):
        from ...cards import CaseSpec

        return self.bury(CaseSpec.model_validate(d))

    def _invoke(self, case, inputs):
        """Call the candidate once after a start line; returns outputs, elapsed ns and the inputs it was shown."""
        cand_inputs = self.op.candidate_inputs(inputs)
        self.dev.align()
        outs, spans = self._timed_calls(case, [inputs])
        return outs[0], spans[0], cand_inputs

    def _timed_calls(self, case, staged: list) -> tuple[list, list[int]]:
        """Call the candidate on each input set in turn, back-to-back (RankDevice.timed_calls), on its own thread.

        Each call is bound completely beforehand: between calls the harness runs nothing the candidate could have
        replaced; the namespaces are settled after the last call (or the first that raises)."""
        run, op_call, fns, rank, world = self.run_candidate, self.op.call, self.fns, self.rank, self.world
        calls = [functools.partial(run, functools.partial(op_call, fns, x, case, rank, world)) for x in staged]
        outs = self.bury([])
        try:
            spans = self.dev.timed_calls(calls, self.clock, self.settle, outs)
        except CandidateRaised as exc:
            if exc.denied:  # the file-system sandbox or the audit hook refused the candidate something
                self.guard.record("sandbox", f"access denied by the sandbox: {exc.text.splitlines()[-1]}")
            raise
        for out in outs:  # the golden op returns plain tensors; anything else means its code was tampered with
            if type(out) is not dict or not all(
                    type(k) is str and type(v) is self.torch.Tensor for k, v in out.items()):
                raise RuntimeError("the submission's outputs were not plain tensors")
        return outs, spans

    def _inputs(self, case, seed: int):
        """This rank's inputs, made on the CPU from its private seed, then moved to the rank's device."""
        return self.bury(self.dev.to_device(self.op.make_inputs(case, self.rank, self.world, int(seed))))

    def _read_only_inputs(self, inputs: dict[str, Any], cand_inputs: Any) -> dict[str, Any]:
        """The inputs the candidate was shown and must leave unchanged, for the coordinator to compare."""
        if not self.card["rules"]["inputs_read_only"]:
            return {}
        return {k: inputs[k] for k in cand_inputs if k in inputs}

    def run_check(self, msg: dict[str, Any]) -> None:
        case = self._case(msg["case"])
        inputs = self._inputs(case, msg["seed"])
        self.send({"type": "staged"})
        self.recv()  # the coordinator's start line: every rank is staged
        out, _, cand_inputs = self._invoke(case, inputs)
        shown = {INPUT_PREFIX + k: v for k, v in self._read_only_inputs(inputs, cand_inputs).items()}
        meta, blob = encode_tensors({**out, **shown})
        self.send({"type": "result", "outputs": meta, "violations": self.guard.violations}, blob)

    def run_bench(self, msg: dict[str, Any]) -> None:
        """Warm-up and timed calls, each on fresh inputs whose seed arrives only when that call (on a GPU: that
        phase) is due; then samples of every timed call's outputs and read-only inputs.

        On the CPU the coordinator releases one call at a time and times it with its own clock, from the release
        to the arrival of the call's samples. On a GPU the calls run back-to-back after one start line, as
        nccl-tests times them: the warm-up calls first, then the timed calls on inputs staged only after the
        warm-up ended, so no warm-up call can see a timed call's inputs. So each call's outputs must be its own:
        a buffer that a later call overwrites fails verification."""
        case = self._case(msg["case"])
        if self.dev.is_cuda:
            self._bench_gpu(case, msg)
            return
        for _ in range(int(msg["calls"])):
            step = self.recv()
            inputs = self._inputs(case, step["seed"])
            self.send({"type": "staged"})
            self.recv()  # go
            out, _, cand_inputs = self._invoke(case, inputs)
            self.send({"type": "done"})
            if step.get("sample"):
                self.send_samples(step["it"], out, self._read_only_inputs(inputs, cand_inputs), bool(msg.get("full_outputs")))

    def _bench_gpu(self, case, msg: dict[str, Any]) -> None:
        full = bool(msg.get("full_outputs"))
        for phase in ("warmup", "timed"):
            step = self.recv()
            staged = [self._inputs(case, seed) for seed in step["seeds"]]
            if not staged:
                continue
            input_bytes = sum(t.numel() * t.element_size() for t in staged[0].values())
            self.dev.reserve(input_bytes * self.world * len(staged))  # outputs up to world x the inputs (all-gather)
            self.barrier()
            self.send({"type": "staged"})
            self.recv()  # go
            self.dev.align()
            outs, spans = self._timed_calls(case, staged)
            self.send({"type": "calls", "phase": phase, "ns": spans, "extended": self.dev.extended})
            if phase == "timed":
                for it, out in enumerate(outs):
                    shown = self._read_only_inputs(staged[it], self.op.candidate_inputs(staged[it]))
                    self.send_samples(int(step["first"]) + it, out, shown, full)

    def send_samples(self, it: int, out: dict[str, Any], inputs: dict[str, Any], full: bool) -> None:
        """The outputs of timed call `it` (whole, or sampled), and samples of the read-only inputs it was shown
        (whole inputs of every timed call were gigabytes through the channel), at positions drawn only after the
        call returned."""
        ask = self.recv()
        tensors = {**(out if full else sample_outputs(out, ask["sample_seed"])),
                   **sample_together(inputs, ask["input_seed"], prefix=INPUT_PREFIX)}
        meta, blob = encode_tensors(tensors)
        self.send({"type": "samples", "it": it, "outputs": meta, "violations": self.guard.violations}, blob)

    def run_profile(self, msg: dict[str, Any]) -> None:
        import torch.profiler as tp

        case = self._case(msg["case"])
        inputs = self._inputs(case, msg["seed"])
        self.barrier()
        self._invoke(case, inputs)  # warm-up
        inputs = self._inputs(case, int(msg["seed"]) + 1)
        self.profiler.reset()
        activities = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if self.dev.is_cuda else [])
        with tp.profile(activities=activities):  # torch's first profile imports modules, wraps torch functions and
            pass  # sets environment variables: let that happen here, on the harness's thread, not the sandboxed one
        self.snapshot[0] = integrity.snapshot()  # and keep what it changed
        self.barrier()
        call = functools.partial(self.run_candidate, functools.partial(
            _profiled, functools.partial(self.op.call, self.fns, inputs, case, self.rank, self.world), activities))
        self.profiler.enabled = True
        profs: list = self.bury([])
        try:  # no start line: no harness kernels in the candidate's table
            (ns,) = self.dev.timed_calls([call], self.clock, self.settle, profs)
        finally:
            self.profiler.enabled = False
        prof = profs[0]
        if type(prof) is not tp.profile:
            raise RuntimeError("the profiler was replaced by the submission")
        rows = []
        for label, times in self.profiler.stats.items():
            rows.append({"name": label, "kind": "comm", "calls": len(times), "total_us": sum(times),
                         "mean_us": sum(times) / len(times)})
        comm_us = self.profiler.outer_us
        ops = [e for e in prof.key_averages() if not e.key.startswith(("gloo", "c10d", "ProfilerStep", "dist."))
               and "gloo" not in e.key and "c10d" not in e.key]
        ops.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
        for e in ops[:10]:
            rows.append({"name": e.key, "kind": "compute", "calls": int(e.count), "total_us": float(e.self_cpu_time_total),
                         "mean_us": float(e.self_cpu_time_total) / max(1, int(e.count))})
        if self.dev.is_cuda:  # GPU kernels by device time; NCCL kernels are communication
            kernels = [e for e in prof.key_averages() if float(getattr(e, "self_device_time_total", 0.0)) > 0]
            kernels.sort(key=lambda e: float(e.self_device_time_total), reverse=True)
            for e in kernels[:10]:
                t = float(e.self_device_time_total)
                rows.append({"name": f"[gpu] {e.key}"[:120], "kind": "comm" if "nccl" in e.key.lower() else "compute",
                             "calls": int(e.count), "total_us": t, "mean_us": t / max(1, int(e.count))})
        wall_us = ns / 1e3
        self.send({"type": "profile", "wall_us": wall_us, "comm_us": comm_us,
                   "compute_us": max(0.0, wall_us - comm_us), "rows": rows, "violations": self.guard.violations})

    def serve(self) -> None:
        handlers = {"check": self.run_check, "bench": self.run_bench, "profile": self.run_profile}
        while True:
            msg = self.recv()
            cmd = msg.get("cmd")
            if cmd == "exit":
                return
            try:
                handlers[cmd](msg)
            except CandidateRaised as exc:
                self.send({"type": "error", "error": exc.text, "violations": self.guard.violations})
            except Exception as exc:  # noqa: BLE001 - a harness-side failure (e.g. outputs of the wrong type)
                self.send({"type": "error", "error": candidate_traceback(exc, self.filename),
                           "violations": self.guard.violations})
            self.release()


def rank_main(rank: int, world: int, sock: socket.socket, spec: dict[str, Any], workdir: Path,
              keep_fds: tuple[int, ...] = ()) -> NoReturn:
    """Entry of a freshly forked rank process. Never returns."""
    def body() -> None:
        isolate.enter(workdir / f"rank{rank}", (sock.fileno(), *keep_fds), cpu_s=int(spec["timeout_s"]) + 5,
                      memory_mb=spec.get("memory_mb"), open_files=1024)
        # torch's deprecation and future warnings (e.g. on APIs the prompts name) are noise in the agent's stderr
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        h = RankHarness(rank, world, sock, spec, workdir)
        h.setup()
        try:
            h.load_candidate()
        except BaseException as exc:  # noqa: BLE001
            text = (exc.text if isinstance(exc, CandidateRaised)
                    else candidate_traceback(exc, spec["card"]["entry"]["file"]))
            h.send({"type": "load_error", "error": text, "violations": h.guard.violations})
        else:
            h.send({"type": "ready"})
            h.serve()

    isolate.run_then_exit(body)  # harness failures go to the rank's stderr; the coordinator sees the exit
