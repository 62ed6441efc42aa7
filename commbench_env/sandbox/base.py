"""The sandbox interface every backend implements. The env and the judge client use nothing else."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..config import StrictModel

if TYPE_CHECKING:
    from .profiles import SandboxProfile


class ExecResult(StrictModel):
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0
    truncated: bool = False


class HardwareInfo(StrictModel):
    """What the code ran on. The fingerprint keys reference figures: same fingerprint, comparable timings."""

    backend: str
    cpu_model: str = ""
    cpu_count: int = 0
    memory_gb: float = 0.0
    gpus: list[str] = []
    driver: str = ""
    cuda: str = ""
    torch: str = ""
    python: str = ""
    platform: str = ""

    @property
    def fingerprint(self) -> str:
        key = "|".join([self.backend, self.cpu_model, str(self.cpu_count), ",".join(self.gpus), self.driver, self.torch])
        return hashlib.sha256(key.encode()).hexdigest()[:16]


class Sandbox(ABC):
    """A place to run commands with files, limits and a lifetime. `start` and `close` bracket one episode or more.

    Paths given to `write_files`, `read_file` and `exec(cwd=...)` are relative to `workdir` unless absolute.
    """

    profile: "SandboxProfile"

    @property
    @abstractmethod
    def workdir(self) -> str:
        """Absolute path of the writable work folder, as seen from inside the sandbox."""

    @property
    @abstractmethod
    def python(self) -> str:
        """The interpreter inside the sandbox that can import commbench_env."""

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def exec(self, cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
             cwd: str | None = None, input: bytes | None = None) -> ExecResult:
        """Run a command to completion or until `timeout`, then kill its whole process group."""

    @abstractmethod
    def write_files(self, files: Mapping[str, str | bytes], base: str = "") -> None: ...

    @abstractmethod
    def read_file(self, path: str) -> bytes: ...

    @abstractmethod
    def hardware(self) -> HardwareInfo: ...

    @abstractmethod
    def close(self) -> None:
        """Stop everything started in the sandbox and remove its files. Idempotent."""

    @property
    def alive(self) -> bool:
        return True

    @property
    def owner_pid(self) -> int:
        """A host process whose death should stop servers left in the sandbox (0: the sandbox's own lifetime)."""
        import os

        return os.getpid()

    def __enter__(self) -> "Sandbox":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
