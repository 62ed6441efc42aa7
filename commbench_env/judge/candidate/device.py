"""Where a rank's tensors live and how one call is timed: CPU (the coordinator's fabric) or a GPU (NCCL, or gloo
in cuda-shared).

Timing on a GPU: the ranks are first aligned on the device (a one-word NCCL all-reduce in `cuda` mode), then a
few milliseconds of memory-bound warm-up work are queued, so that the candidate's launches are already waiting
when the start event fires (host latency before the first kernel is not counted unless the GPU runs dry) and the
GPU is as busy as in a back-to-back loop. Measured on H200s (FACTS.md): one call timed after 20 ms of idle took
2.2x (device copy) to 2.7x (NCCL all-reduce) as long as the same call inside a back-to-back loop, and the same
call timed right after a busy kernel matched the loop within 1 %. The warm-up streams far more than the L2 holds,
so every GPU timing starts from a cold L2. The stop is an event queued on the harness's stream right after the
call; if the device still has work after that event (async work never waited for, a background thread), the
calls are timed as a whole up to a device-wide synchronisation, so hidden work still counts (candidates may not
make streams of their own: `rules.STREAM_APIS`). The zygote and the coordinator
never touch CUDA; only forked ranks do (CUDA cannot be used across fork).
"""

from __future__ import annotations

import ctypes
import functools
import time
from typing import Any, Callable

L2_FLUSH_BYTES = 256 << 20  # larger than any current GPU's L2 (H200: 50 MiB)
WARM_UP_PASSES = 24  # read-modify-write passes over L2_FLUSH_BYTES before a start line: about 3 ms on an H200
HIDDEN_WORK_NS = 50_000  # a device sync after the stop mark waiting this much over an idle one: hidden work
HOST_NOISE_CAP_NS = 100_000  # most host noise a hidden-work check allows for (see `work_outlived_call`)


def work_outlived_call(wait_ns: int, idle_wait_ns: int) -> bool:
    """Whether a device sync after a call's stop mark waited for real work, not host noise: HIDDEN_WORK_NS beyond
    what a sync of the idle device took before the call, an allowance capped at HOST_NOISE_CAP_NS (so background
    work queued then cannot buy a larger one). On 2 x H200, syncs after honest calls took 14-60 us through
    torch.cuda.synchronize, and a fixed 50 us threshold extended 53 of 557 calls by about 250 us each
    (benchmarks/results/reward_stability-2026-11-29-2gpu.md, session 6)."""
    return wait_ns > HIDDEN_WORK_NS + min(max(0, idle_wait_ns), HOST_NOISE_CAP_NS)


def sleep_cycles(torch: Any, device: Any, seconds: float) -> int:
    """Clock cycles for torch.cuda._sleep to spin about `seconds` on this device."""
    khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 0) or 2_000_000
    return max(1000, int(seconds * khz * 1e3))


class WarmUp:
    """Memory-bound work queued right before a start line: keeps the GPU out of the slower state it drops into
    when idle between timed calls, and gives the host time to queue the candidate's launches behind it.

    Its buffer and the in-place add are taken when the harness starts, before any candidate code exists."""

    def __init__(self, torch: Any, device: Any):
        self.buffer = torch.zeros(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
        self._add = torch.Tensor.add_
        self._add(self.buffer, 1)  # load the kernel now: a lazy module load later may wait on a held stream
        torch.cuda.synchronize(device)

    def __call__(self) -> None:
        for _ in range(WARM_UP_PASSES):
            self._add(self.buffer, 1)


def reset_persisting_l2(cudart: Any) -> None:
    """Undo any persisting-L2 set-aside a candidate made, so it cannot carry cached lines across timed calls."""
    if cudart is None:
        return
    cudart.cudaCtxResetPersistingL2Cache()
    cudart.cudaDeviceSetLimit(0x06, 0)  # cudaLimitPersistingL2CacheSize = 0
    cudart.cudaGetLastError()  # leave no sticky "not supported" behind on GPUs without the feature


def cudart_library() -> ctypes.CDLL | None:
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


class RankDevice:
    def __init__(self, mode: str, rank: int, world: int):
        import torch

        self.torch = torch
        self.mode = mode
        self.rank = rank
        self.world = world
        if mode == "cpu":
            self.device = torch.device("cpu")
            self.backend = "commbench"  # the coordinator's fabric (fabric_group.py)
            return
        if not torch.cuda.is_available():
            raise RuntimeError(f"device mode {mode!r} needs a CUDA GPU, and torch sees none here")
        count = torch.cuda.device_count()
        if mode == "cuda":
            if world > count:
                raise RuntimeError(f"device mode 'cuda' runs one rank per GPU: world {world} needs {world} GPUs, "
                                   f"this sandbox has {count}")
            index = rank
            self.backend = "nccl"
        else:  # cuda-shared: every rank on the first visible GPU; NCCL refuses that, gloo carries CUDA tensors
            index = 0
            self.backend = "gloo"
        torch.cuda.set_device(index)
        self.device = torch.device("cuda", index)
        self._one = torch.zeros(1, device=self.device)  # stays 0 however often it is summed
        self._warm_up = WarmUp(torch, self.device)
        self._cudart = cudart_library()
        # Bound now, before any candidate code exists, and to torch's C functions, which look nothing up when
        # called: between back-to-back calls the harness must run nothing the candidate could have replaced.
        base, stream = torch._C._CudaEventBase, torch.cuda.current_stream(self.device)
        self._event = torch.cuda.Event
        self._record = functools.partial(_record_on, base.record, stream)
        self._ev_sync, self._elapsed = base.synchronize, base.elapsed_time
        self._sync = torch._C._cuda_synchronize  # this thread's current device, set above
        self._group_all_reduce: Any = None
        self._idle_sync_ns = 0  # what a sync of the idle device took at the last start line
        self.extended = False  # whether the last timed calls' clock ran on to a device-wide sync

    def bind_group(self, group: Any) -> None:
        """Keep the process group's own all-reduce method for `align`; call before any tripwire is installed,
        so that the harness's start line neither trips a forbidden-API rule nor shows in the candidate's counts."""
        if self.backend == "nccl":
            self._group_all_reduce = group.allreduce

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def to_device(self, tensors: dict[str, Any]) -> dict[str, Any]:
        if not self.is_cuda:
            return tensors
        return {k: v.to(self.device) for k, v in tensors.items()}

    def synchronize(self) -> None:
        if self.is_cuda:
            self._sync()

    def reserve(self, nbytes: int) -> None:
        """Leave about `nbytes` free in torch's caching allocator before a timed window, so that what the candidate
        allocates inside it is carved from cached memory, not taken with cudaMalloc. A cudaMalloc holds the host
        far longer than a 64 MiB collective runs, so the GPU ran dry between calls: all_gather, reduce_scatter and
        alltoall read 0.23-0.49 of nccl-tests at 64 MiB over 20 calls, in-place all_reduce 0.99. Training loops
        reuse cached blocks the same way, and nccl-tests allocates once. At most half the free memory is used
        (shared among the ranks of one GPU in cuda-shared)."""
        if not self.is_cuda or nbytes <= 0:
            return
        free, _ = self.torch.cuda.mem_get_info(self.device)
        ranks_here = self.world if self.mode == "cuda-shared" else 1
        nbytes = min(nbytes, free // (2 * ranks_here))
        block = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)
        del block  # the segment stays in the allocator's cache

    def align(self) -> None:
        """Queue a device-side start line before a timed call (harness code, on the harness's thread).

        In `cuda` mode a one-word all-reduce on the default group holds every rank's stream until the last rank
        arrives (a host barrier leaves hundreds of microseconds of skew); then every rank runs the same warm-up,
        so the start events of all ranks fire together on a busy GPU with the candidate's launches queued."""
        if not self.is_cuda:
            return
        self._sync()  # inputs staged, previous call finished
        t0 = time.perf_counter_ns()
        self._sync()
        self._idle_sync_ns = time.perf_counter_ns() - t0
        reset_persisting_l2(self._cudart)
        if self._group_all_reduce is not None:
            self._group_all_reduce([self._one]).wait()  # the stream waits for it; the host does not
        self._warm_up()

    def timed_calls(self, fns: list[Callable[[], Any]], clock: Callable[[], int], settle: Callable[[], None],
                    outs: list[Any]) -> list[int]:
        """Run the calls back-to-back, appending their results to `outs`; returns the ns each took.

        On a GPU, an event is queued before the first call and after each one, so call i took the time between
        marks i and i+1 on the device (host time shows only where the host falls behind the GPU), as in
        nccl-tests' timing loop. If work outlives the calls (async work never waited for, which the marks do not
        order), they are timed as a whole, from the first mark to a device-wide sync, and each call gets an equal
        share: the per-call marks said nothing about that work. On the CPU each call is timed with the host clock.
        The calls run candidate code, which may replace module and class attributes: until `settle` has put them
        back, right after the last call's clock has stopped, only locals bound here are touched."""
        keep = outs.append
        if not self.is_cuda:
            spans: list[int] = []
            span = spans.append
            for fn in fns:
                t0 = clock()
                keep(fn())
                span(clock() - t0)
            settle()
            return spans
        marks = [self._event(enable_timing=True) for _ in range(len(fns) + 1)]
        record = self._record
        record(marks[0])
        for fn, mark in zip(fns, marks[1:]):
            keep(fn())
            record(mark)
        settle()
        self._ev_sync(marks[-1])
        t0 = clock()
        self._sync()
        self.extended = work_outlived_call(clock() - t0, self._idle_sync_ns)
        if self.extended:  # work outlived the calls: all of them count up to the device sync
            end = self._event(enable_timing=True)
            record(end)
            self._ev_sync(end)
            share = int(self._elapsed(marks[0], end) * 1e6) // len(fns)
            return [share] * len(fns)
        return [int(self._elapsed(a, b) * 1e6) for a, b in zip(marks, marks[1:])]

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mode": self.mode, "device": str(self.device), "backend": self.backend}
        if self.is_cuda:
            d["gpu"] = self.torch.cuda.get_device_name(self.device)
        return d


def _record_on(record: Callable[[Any, Any], None], stream: Any, event: Any) -> None:
    record(event, stream)


def now() -> int:
    return time.perf_counter_ns()
