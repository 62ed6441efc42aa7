"""Sandbox profiles: `sandboxes/<name>.toml` cards that choose a backend, device mode and limits."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from ..config import StrictModel, list_cards, load_named_card
from ..paths import sandboxes_dir
from ..judge.link_model import LinkModel


class Limits(StrictModel):
    exec_timeout_s: float = Field(default=600.0, gt=0, description="hard limit of any one command in the sandbox")
    memory_mb: int | None = Field(default=None, description="address-space limit of each rank (None: no limit)")
    cpu_time_s: int = Field(default=3600, description="CPU-time limit of each process started by exec")
    open_files: int = 4096
    processes: int = Field(default=512, description="process limit for the sandbox user (ignored for root)")
    max_output_bytes: int = Field(default=1 << 20, description="stdout/stderr kept per command; the rest is cut")


class GpuSelection(StrictModel):
    ids: list[int] = Field(default_factory=list, description="GPU indices to use (nvidia-smi's); empty: the host's GPUs")
    count: int = 0
    shared: bool = Field(default=False, description="let episodes share GPUs: no GPU leases, so a timing may be "
                         "taken while another episode runs on the same GPU (throughput over honest figures)")


class DockerSpec(StrictModel):
    """Container settings of docker profiles."""

    image: str | None = Field(default=None, description="use this image as is; default: the one built from `flavor`")
    flavor: Literal["cpu", "cuda"] = Field(default="cpu", description="which dockerfiles/<flavor>/Dockerfile to build")
    base: str | None = Field(default=None, description="base image (build arg BASE); cpu default: a debootstrap base")
    memory_mb: int = Field(default=8192, description="memory limit of the whole container (swap included)")
    cpus: float | None = Field(default=None, description="CPU limit of the container; None: no limit")
    workdir_mb: int = Field(default=1024, description="size of the writable work folder (a tmpfs)")
    shm_mb: int = Field(default=1024, description="/dev/shm size (NCCL's shared-memory transport uses it)")
    mount_package: bool = Field(default=True, description="mount this host's commbench_env read-only over the image's "
                                "copy, so the judge in the container is the host's version without a rebuild")


class SandboxProfile(StrictModel):
    name: str
    description: str = ""
    backend: Literal["local", "docker"]
    device_mode: Literal["cpu", "cuda", "cuda-shared"] = "cpu"
    python: str | None = Field(default=None, description="interpreter in the sandbox; local default: this one")
    image: str | None = None
    warm_server: bool = Field(default=True, description="keep a judge server with torch imported (fast steps)")
    fresh_per_episode: bool = Field(default=False, description="start a new sandbox at every reset")
    threads_per_rank: int | None = None
    accept_weak_isolation: bool = Field(default=False, description="count results as leaderboard-grade even where "
                                        "the host lacks a kernel layer of the trust model (Landlock, seccomp)")
    env: dict[str, str] = Field(default_factory=dict)
    limits: Limits = Field(default_factory=Limits)
    gpus: GpuSelection = Field(default_factory=GpuSelection)
    docker: DockerSpec = Field(default_factory=DockerSpec)
    link_model: LinkModel = Field(default_factory=LinkModel, description="the hardware a CPU evaluation's modelled "
                                  "time stands for (the CPU reward scores that time, not the wall time)")
    source: str = Field(default="", exclude=True)

    @property
    def leases_gpus(self) -> bool:
        """Whether an episode must hold its GPUs alone: a kernel's timing on a GPU that another episode is using
        says nothing about the kernel. Profiles that set `gpus.shared` (throughput over timing) do not."""
        return self.device_mode != "cpu" and not self.gpus.shared

    def with_env(self, extra: dict[str, str]) -> "SandboxProfile":
        """This profile with `extra` added to the sandbox's environment (e.g. a diagnostic trace file)."""
        return self.model_copy(update={"env": {**self.env, **extra}})


def list_profiles(base: Path | None = None) -> list[str]:
    return list_cards(base or sandboxes_dir())


# the embedded local profile that runs each GPU device mode (benchmark scripts pick theirs by mode)
GPU_PROFILE_FOR_MODE = {"cuda": "local-gpu", "cuda-shared": "local-gpu-shared"}


def load_profile(name_or_path: str | Path) -> SandboxProfile:
    return load_named_card(SandboxProfile, sandboxes_dir(), name_or_path, "sandbox profile")
