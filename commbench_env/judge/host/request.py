"""What the host sends the judge (over stdin, never as a file: it carries the secret and the hidden cases)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ...config import StrictModel
from ..link_model import LinkModel
from .result import Mode


class JudgeRequest(StrictModel):
    task: dict[str, Any] = Field(description="Task.judge_spec(): the card (hidden cases included) and its hash")
    mode: Mode
    world_size: int = Field(ge=1)
    device_mode: str = "cpu"
    secret: str = Field(min_length=32, description="hex; per evaluation; only the coordinator ever holds it")
    workdir: str = Field(description="evaluation folder inside the sandbox; candidate files are in workdir/candidate")
    source_hash: str = ""
    timeout_s: float | None = None
    memory_mb: int | None = None
    threads_per_rank: int | None = None
    static_check: bool = Field(default=True, description="tests turn this off to prove the runtime layer alone")
    landlock: bool = Field(default=True, description="confine each rank's files with Landlock where the kernel has it")
    accept_weak_isolation: bool = Field(default=False, description="the profile's opt-in: a result is "
                                        "leaderboard-grade even if a kernel layer is missing")
    max_output_chars: int = 4000
    link_model: LinkModel = Field(default_factory=LinkModel, description="the hardware a CPU evaluation's modelled "
                                  "time stands for")
    cache_dir: str | None = Field(default=None, description="build cache of cuda candidates (kept across evaluations)")
    cleanup: bool = Field(default=True, description="remove the evaluation folder afterwards (fresh dirs, no state)")
