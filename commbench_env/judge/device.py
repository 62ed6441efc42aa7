"""Where a rank's tensors live and how one call is timed: CPU (gloo) or a GPU (NCCL, or gloo in cuda-shared).

Timing on a GPU: CUDA events on the harness's stream with a device-wide synchronisation before the stop event,
so work the candidate hid on side streams still counts. The zygote and the coordinator never touch CUDA; only
forked ranks do (CUDA cannot be used across fork).
"""

from __future__ import annotations

import time
from typing import Any, Callable

L2_FLUSH_BYTES = 256 << 20  # larger than any current GPU's L2 (H200: 50 MiB)


class RankDevice:
    def __init__(self, mode: str, rank: int, world: int):
        import torch

        self.torch = torch
        self.mode = mode
        self.rank = rank
        self._flush: Any = None
        if mode == "cpu":
            self.device = torch.device("cpu")
            self.backend = "gloo"
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

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def to_device(self, tensors: dict[str, Any]) -> dict[str, Any]:
        if not self.is_cuda:
            return tensors
        return {k: v.to(self.device) for k, v in tensors.items()}

    def synchronize(self) -> None:
        if self.is_cuda:
            self.torch.cuda.synchronize(self.device)

    def flush_l2(self) -> None:
        """Evict the L2 cache between timed iterations (cards that ask for cold-cache timing)."""
        if self.is_cuda:
            if self._flush is None:
                self._flush = self.torch.empty(L2_FLUSH_BYTES, dtype=self.torch.uint8, device=self.device)
            self._flush.zero_()
            self.synchronize()

    def timed(self, fn: Callable[[], Any], clock: Callable[[], int]) -> tuple[Any, int]:
        """Run fn once; returns (its result, elapsed ns) measured on this device."""
        if not self.is_cuda:
            t0 = clock()
            out = fn()
            return out, clock() - t0
        torch = self.torch
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(self.device)
        start.record()
        out = fn()
        torch.cuda.synchronize(self.device)  # side streams and background work finish before the clock stops
        stop.record()
        stop.synchronize()
        return out, int(start.elapsed_time(stop) * 1e6)

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mode": self.mode, "device": str(self.device), "backend": self.backend}
        if self.is_cuda:
            d["gpu"] = self.torch.cuda.get_device_name(self.device)
        return d


def now() -> int:
    return time.perf_counter_ns()
