"""The device host: one process that runs every rank of a `cuda` task, one host thread and stream per rank.

Why one process: kernels that spin on flags written by other ranks only make progress together when they run in
one CUDA context (separate processes on one GPU are time-sliced, about 13 ms per hand-off on an H200), and on
several GPUs one process with peer access gives every rank direct pointers to its peers' buffers without IPC.
The judge owns every buffer (inputs, outputs, scratch, flags) and passes raw pointers through `cb_args`.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from . import isolate
from .protocol import encode_tensors, recv_msg, send_msg

MAX_RANKS, MAX_PARAMS, MAX_AUX = 8, 8, 4
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


def _cudart() -> ctypes.CDLL | None:
    """The CUDA runtime torch already loaded (its soname satisfies the candidate's -cudart=shared too)."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {ln.split()[-1] for ln in fh if "libcudart.so" in ln}
    except OSError:
        paths = set()
    for p in sorted(paths):
        try:
            return ctypes.CDLL(p)
        except OSError:
            continue
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


class DeviceHost:
    def __init__(self, world: int, sock: socket.socket, spec: dict[str, Any], library: str):
        import torch

        from ..golden import get_op

        self.torch, self.world, self.sock, self.spec = torch, world, sock, spec
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
        self.streams = []
        for d in self.devices:
            torch.cuda.set_device(d)
            self.streams.append(torch.cuda.Stream(device=d))
        self.peer_access = self._enable_peer_access()
        self.library_path = library
        self.epoch = 0
        self.timeout_s = float(spec["timeout_s"])

    def _enable_peer_access(self) -> bool:
        distinct = sorted(set(self.devices))
        if len(distinct) < 2:
            return True
        rt = _cudart()
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

    def load(self) -> None:
        lib = ctypes.CDLL(self.library_path)
        self.fns = {}
        for name in self.card["entry"]["functions"]:
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.POINTER(CbArgs), ctypes.c_void_p]
            fn.restype = ctypes.c_int
            self.fns[name] = fn
        self.fn = self.fns[self.card["entry"]["functions"][0]]

    # -- buffers -------------------------------------------------------------------------------------
    def prepare(self, case, seeds: list[int], out_specs: list[dict]) -> list[dict]:
        """Allocate and fill every rank's buffers for one call."""
        torch = self.torch
        from ..golden.base import DTYPE_MAP

        bufs = []
        for r, (seed, dev) in enumerate(zip(seeds, self.devices)):
            host_inputs = self.op.make_inputs(case, r, self.world, int(seed))
            dv = torch.device("cuda", dev)
            inputs = {k: v.to(dv).contiguous() for k, v in host_inputs.items()}
            outs = {}
            for name, meta in out_specs[r].items():
                dt = DTYPE_MAP[meta["dtype"]]
                t = torch.empty(meta["shape"], dtype=dt, device=dv)
                t.fill_(float("nan")) if dt.is_floating_point else t.fill_(-1 if dt != torch.bool else True)
                outs[name] = t
            bufs.append({"inputs": inputs, "pristine": {k: v.clone() for k, v in inputs.items()}, "outs": outs})
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
            for p, pb in enumerate(bufs):
                a.peer_in[p] = pb["inputs"][c["input"]].data_ptr()
                a.peer_out[p] = pb["outs"][c["output"]].data_ptr()
                a.peer_scratch[p] = pb["scratch"].data_ptr()
                a.peer_flags[p] = pb["flags"].data_ptr()
            for i, key in enumerate(c["params"][:MAX_PARAMS]):
                a.params[i] = int(case.params.get(key, 0))
            for i, name in enumerate(c["aux_inputs"][:MAX_AUX]):
                a.aux_in[i], a.aux_in_count[i] = b["inputs"][name].data_ptr(), b["inputs"][name].numel()
            for i, name in enumerate(c["aux_outputs"][:MAX_AUX]):
                a.aux_out[i], a.aux_out_count[i] = b["outs"][name].data_ptr(), b["outs"][name].numel()
            out.append(a)
        return out

    # -- one call of every rank, concurrently ------------------------------------------------------------
    def call_all(self, args: list[CbArgs]) -> list[int]:
        """Returns per-rank ns (CUDA events, device-wide sync before the stop). Raises naming hung ranks."""
        torch = self.torch
        self.epoch += 1
        for a in args:
            a.epoch = self.epoch
        for d in set(self.devices):
            torch.cuda.synchronize(d)
        world = self.world
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(world)]
        dones = [torch.cuda.Event() for _ in range(world)]
        rcs: list[int | None] = [None] * world
        errors: list[str | None] = [None] * world
        gate = threading.Barrier(world)

        def run(r: int) -> None:
            try:
                torch.cuda.set_device(self.devices[r])
                s = self.streams[r]
                gate.wait(timeout=self.timeout_s)
                starts[r].record(s)
                rcs[r] = self.fn(ctypes.byref(args[r]), ctypes.c_void_p(s.cuda_stream))
                dones[r].record(s)
            except BaseException as exc:  # noqa: BLE001
                errors[r] = f"{type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + max(1.0, self.timeout_s - 3.0)
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        stuck_host = [r for r, t in enumerate(threads) if t.is_alive()]
        if stuck_host:
            raise HungRanks(stuck_host, "did not return from the entry point (host code blocked)")
        for r in range(world):
            if errors[r]:
                raise RuntimeError(f"rank {r}: {errors[r]}")
            if rcs[r] != 0:
                raise RuntimeError(f"rank {r}: the entry point returned {rcs[r]} (non-zero means error)")
        while True:
            pending = [r for r in range(world) if not dones[r].query()]
            if not pending:
                break
            if time.monotonic() > deadline:
                raise HungRanks(pending, "kernels still running at the time limit (a deadlock or a missed flag?)")
            time.sleep(0.0005)
        for d in set(self.devices):
            torch.cuda.synchronize(d)  # side streams too: everything finishes before the clocks stop
        stops = []
        for r in range(world):
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(self.streams[r])
            stops.append(ev)
        for ev in stops:
            ev.synchronize()
        return [int(starts[r].elapsed_time(stops[r]) * 1e6) for r in range(world)]

    def outputs(self, bufs: list[dict]) -> dict[str, Any]:
        flat = {}
        for r, b in enumerate(bufs):
            for name, t in b["outs"].items():
                flat[f"{r}/{name}"] = t.detach().cpu()
        return flat

    def mutated(self, bufs: list[dict]) -> list[tuple[int, str]]:
        out = []
        for r, b in enumerate(bufs):
            for k, v in b["inputs"].items():
                p = b["pristine"][k]
                same = bool(self.torch.equal(v, p)) or (v.is_floating_point() and bool(
                    self.torch.equal(v.nan_to_num(), p.nan_to_num())))
                if not same:
                    out.append((r, k))
        return out

    # -- commands ------------------------------------------------------------------------------------
    def send(self, header: dict, blob: bytes = b"") -> None:
        send_msg(self.sock, header, blob)

    def run_check(self, msg: dict, case) -> None:
        bufs = self.prepare(case, msg["seeds"], msg["out_specs"])
        self.scratch_for(bufs)
        ns = self.call_all(self.args_for(case, bufs))
        meta, blob = encode_tensors(self.outputs(bufs))
        self.send({"type": "result", "outputs": meta, "ns": ns, "mutated": self.mutated(bufs)}, blob)

    def run_bench(self, msg: dict, case) -> None:
        torch = self.torch
        warmup = int(msg["warmup"])
        seeds = msg["seeds"]  # [rank][iteration]
        scratch_ready = None
        for it in range(len(seeds[0])):
            bufs = self.prepare(case, [seeds[r][it] for r in range(self.world)], msg["out_specs"])
            if scratch_ready is None:
                self.scratch_for(bufs)
                scratch_ready = [(b["scratch"], b["flags"]) for b in bufs]
            else:
                for b, (sc, fl) in zip(bufs, scratch_ready):
                    b["scratch"], b["flags"] = sc, fl
            if msg.get("flush_l2"):
                for d in set(self.devices):
                    torch.empty(256 << 20, dtype=torch.uint8, device=f"cuda:{d}").zero_()
            ns = self.call_all(self.args_for(case, bufs))
            self.send({"type": "iter", "it": it, "ns": ns})
            if it < warmup:
                continue
            ask, _ = recv_msg(self.sock)  # positions are chosen after the outputs exist
            sampled = {}
            for r, b in enumerate(bufs):
                gen = torch.Generator().manual_seed(int(ask["sample_seed"]))  # the coordinator draws alike per rank
                for name, t in sorted(b["outs"].items()):
                    flat = t.detach().reshape(-1).cpu()
                    if flat.numel():
                        idx = torch.randint(0, flat.numel(), (min(256, flat.numel()),), generator=gen)
                        sampled[f"{r}/{name}"] = flat[idx].clone()
                    else:
                        sampled[f"{r}/{name}"] = flat
                    sampled[f"{r}/{name}#numel"] = torch.tensor([flat.numel()])
            meta, blob = encode_tensors(sampled)
            self.send({"type": "samples", "it": it, "outputs": meta}, blob)

    def run_profile(self, msg: dict, case) -> None:
        """One warm-up call, then one call under the torch profiler: a table of GPU kernels per rank."""
        import torch.profiler as tp

        bufs = self.prepare(case, msg["seeds"], msg["out_specs"])
        self.scratch_for(bufs)
        self.call_all(self.args_for(case, bufs))
        with tp.profile(activities=[tp.ProfilerActivity.CPU, tp.ProfilerActivity.CUDA]) as prof:
            ns = self.call_all(self.args_for(case, bufs))
        rows = []
        for e in prof.key_averages():
            t = float(getattr(e, "self_device_time_total", 0.0))
            if t > 0:
                rows.append({"name": e.key[:120], "kind": "comm" if "nccl" in e.key.lower() else "compute",
                             "calls": int(e.count), "total_us": t, "mean_us": t / max(1, int(e.count))})
        rows.sort(key=lambda r: r["total_us"], reverse=True)
        self.send({"type": "profile", "ns": ns, "rows": rows[:15]})

    def serve(self) -> None:
        from ..cards import CaseSpec

        while True:
            msg, _ = recv_msg(self.sock)
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


class HungRanks(Exception):
    def __init__(self, ranks: list[int], why: str):
        super().__init__(f"rank(s) {', '.join(map(str, ranks))} {why}")
        self.ranks = ranks


def _enter_sandbox(rdir: Path, keep_fd: int, spec: dict[str, Any], redirect: bool) -> None:
    """Own session, own folder, limits, non-dumpable; stdout/stderr to files unless a sanitizer reads them."""
    isolate.enter(rdir, (keep_fd,), cpu_s=int(spec["timeout_s"]) + 5, memory_mb=None, open_files=65536,
                  redirect=redirect)
    # One hardware queue per rank stream: with the default 8 connections, two ranks' streams can share a queue,
    # and work queued behind one rank's spinning kernel would keep another rank's kernel from ever starting.
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")


def _host_loop(world: int, sock: socket.socket, spec: dict[str, Any], library: str, rdir: Path,
               extra_writable: tuple[str, ...] = ()) -> None:
    host = DeviceHost(world, sock, spec, library)
    iso = {"landlock_abi": 0, "process": "one device host for all ranks"}
    if spec.get("landlock", True):
        from . import landlock

        writable = [str(rdir), *(p for p in ("/dev/shm", *extra_writable) if os.path.isdir(p))]
        iso["landlock_abi"] = landlock.restrict(writable=writable, readable=landlock.default_read_paths()
                                                + [str(Path(library).parent)], device_rw=["/dev"],
                                                scope_abstract_sockets=False)
    host.load()  # the candidate's library (and its static initialisers) only inside the sandbox
    send_msg(sock, {"type": "ready", "rendezvous_s": 0.0, "isolation": iso,
                    "device": {"mode": spec["device_mode"], "devices": host.devices,
                               "gpu": host.torch.cuda.get_device_name(0)}})
    host.serve()


def device_host_main(world: int, sock: socket.socket, spec: dict[str, Any], workdir: Path, library: str) -> NoReturn:
    """Entry of the forked device-host process. Never returns."""
    def body() -> None:
        rdir = workdir / "rank0"
        _enter_sandbox(rdir, sock.fileno(), spec, redirect=True)
        _host_loop(world, sock, spec, library, rdir)

    isolate.run_then_exit(body, lambda err: send_msg(sock, {"type": "load_error", "error": err}))


def main() -> None:
    """`python -m commbench_env.judge.device_host --fd N --workdir DIR`: a fresh device host, e.g. under
    compute-sanitizer. The first message on the socket carries world, spec and library."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    sock = socket.socket(fileno=a.fd)

    def body() -> None:
        init, _ = recv_msg(sock)
        rdir = Path(a.workdir) / "sanitize"
        _enter_sandbox(rdir, sock.fileno(), init["spec"], redirect=False)
        _host_loop(int(init["world"]), sock, init["spec"], init["library"], rdir, extra_writable=("/tmp",))

    isolate.run_then_exit(body, lambda err: send_msg(sock, {"type": "load_error", "error": err}))


if __name__ == "__main__":
    main()
