"""Sandbox profiles: `sandboxes/<name>.toml` cards that choose a backend, device mode and limits."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from ..config import StrictModel, list_cards, load_named_card
from ..errors import CardError
from ..paths import sandboxes_dir
from .base import Sandbox


class Limits(StrictModel):
    exec_timeout_s: float = Field(default=600.0, gt=0, description="hard limit of any one command in the sandbox")
    memory_mb: int | None = Field(default=None, description="address-space limit of each rank (None: no limit)")
    cpu_time_s: int = Field(default=3600, description="CPU-time limit of each process started by exec")
    open_files: int = 4096
    processes: int = Field(default=512, description="process limit for the sandbox user (ignored for root)")
    max_output_bytes: int = Field(default=1 << 20, description="stdout/stderr kept per command; the rest is cut")


class GpuSelection(StrictModel):
    ids: list[int] = Field(default_factory=list, description="GPU indices to use; empty with count=0: none")
    count: int = 0
    shared: bool = Field(default=False, description="allow episodes to share GPUs (docker/pool scheduler)")


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
    env: dict[str, str] = Field(default_factory=dict)
    limits: Limits = Field(default_factory=Limits)
    gpus: GpuSelection = Field(default_factory=GpuSelection)
    source: str = Field(default="", exclude=True)


def list_profiles(base: Path | None = None) -> list[str]:
    return list_cards(base or sandboxes_dir())


def load_profile(name_or_path: str | Path) -> SandboxProfile:
    return load_named_card(SandboxProfile, sandboxes_dir(), name_or_path, "sandbox profile")


def open_sandbox(profile: SandboxProfile | str) -> Sandbox:
    """A not-yet-started sandbox for a profile."""
    prof = load_profile(profile) if isinstance(profile, str) else profile
    if prof.backend == "local":
        from .local import LocalSandbox

        return LocalSandbox(prof)
    raise CardError(f"{prof.source or prof.name}: field 'backend': {prof.backend!r} is not available in this version")
