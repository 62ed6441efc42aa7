"""What a rank's bandwidth is measured against, found in the ranks themselves (the coordinator never touches CUDA).

- `cuda-shared`: every rank shares one GPU, so the ceiling is that device's own copy bandwidth, split between the
  ranks. Figures in this mode are emulated: they say nothing about NVLink.
- `cuda`: the per-direction NVLink bandwidth of the rank's GPU from NVML (active links x per-link speed), or from
  `nvidia-smi nvlink -s` where NVML lacks the speed field, or else a measured peer copy between the first two GPUs.
- `cpu`: none.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

COPY_BYTES = 256 << 20  # well past the L2 of any current GPU (H200: 50 MiB)


def copy_gbps(torch: Any, src_dev: int, dst_dev: int, nbytes: int = COPY_BYTES, reps: int = 5) -> float:
    """Payload GB/s of tensor.copy_ (the copy engine) from src_dev to dst_dev, timed with CUDA events right after
    untimed copies, so the GPU is busy when the clock starts (as in the judge's timed calls, see device.WarmUp)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src_dev}")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst_dev}")
    with torch.cuda.device(dst_dev):
        for _ in range(reps):
            dst.copy_(src)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            dst.copy_(src)
        stop.record()
        stop.synchronize()
    torch.cuda.synchronize(src_dev)
    seconds = start.elapsed_time(stop) / 1e3 / reps
    del src, dst
    return nbytes / seconds / 1e9


def nvlink_gbps(device_index: int) -> float | None:
    """Per-direction NVLink bandwidth of one GPU from NVML, or None where NVML or NVLink is absent."""
    try:
        import pynvml as nv

        nv.nvmlInit()
        try:
            h = nv.nvmlDeviceGetHandleByIndex(device_index)
            active = 0
            for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    active += nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED
                except nv.NVMLError:
                    break
            fv = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON])[0]
            mbps = fv.value.uiVal if fv.nvmlReturn == 0 else 0
            return active * mbps / 1e3 if active and mbps else None
        finally:
            nv.nvmlShutdown()
    except Exception:  # noqa: BLE001 - NVML missing, too old, or no NVLink: the caller measures instead
        return None


def parse_nvlink_status(text: str) -> float | None:
    """Sum of the per-link rates in `nvidia-smi nvlink -s` output ('Link 0: 26.562 GB/s'); None if none active."""
    rates = [float(m.group(1)) for m in re.finditer(r"Link\s+\d+:\s*([0-9.]+)\s*GB/s", text)]
    return sum(rates) if rates else None


def nvlink_gbps_smi(device_index: int) -> float | None:
    """Per-direction NVLink bandwidth from nvidia-smi, for drivers whose NVML lacks the link-speed field
    (seen on H200 with driver 580: NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON is 'not supported')."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "nvlink", "-s", "-i", str(device_index)], capture_output=True, text=True,
                             timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvlink_status(out)


def measure(torch: Any, mode: str, world: int, devices: list[int]) -> dict[str, Any] | None:
    """The roofline of this evaluation: {name, gbps, per_rank_gbps, emulated}; None on CPU or on failure."""
    try:
        if mode == "cuda-shared":
            dev = devices[0]
            bw = copy_gbps(torch, dev, dev)
            return {"name": "device copy bandwidth (cuda-shared: emulated, not NVLink)", "gbps": bw,
                    "per_rank_gbps": bw / max(1, world), "emulated": True}
        if mode == "cuda":
            for source, nv in (("NVML", nvlink_gbps(devices[0])), ("nvidia-smi", nvlink_gbps_smi(devices[0]))):
                if nv:
                    return {"name": f"NVLink per direction ({source})", "gbps": nv, "per_rank_gbps": nv,
                            "emulated": False}
            if len(set(devices)) >= 2:
                bw = copy_gbps(torch, devices[0], devices[1])
                return {"name": "measured peer copy", "gbps": bw, "per_rank_gbps": bw, "emulated": False}
    except Exception:  # noqa: BLE001 - a roofline is a courtesy; never fail an evaluation over it
        return None
    return None
