"""Host side of the judge: puts candidate files into a sandbox, runs the judge there, reads its result.

The request (with the secret seed and hidden cases) travels on the judge's stdin; the result comes back on the
judge's stdout after a marker. Candidate processes have neither: their output goes to files the judge reads.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...cards import Task
from ...errors import CardError, JudgeInfraError, SandboxError, UnservableError
from .request import JudgeRequest
from .result import JudgeResult, Mode, Verdict
from .worlds import merge_worlds, other_worlds
from ..protocol import RESULT_MARK, judge_command

if TYPE_CHECKING:  # the judge drives any Sandbox through its interface; the pool (sandbox/pool.py) imports this
    from ...sandbox import HardwareInfo, Sandbox

# Seconds the judge may take beyond the task's own time limit (process start, verification, clean-up).
JUDGE_MARGIN_S = 60.0


def source_hash(files: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return h.hexdigest()[:16]


def require_gpus(task: Task, device_mode: str, world_size: int, hardware: HardwareInfo, profile: str) -> None:
    """Raise UnservableError if `hardware` has fewer GPUs than `task` needs in `device_mode` at `world_size`."""
    if device_mode not in ("cuda", "cuda-shared"):
        return
    need = world_size if device_mode == "cuda" else 1
    if len(hardware.gpus) < need:
        raise UnservableError(
            f"{task.id} in device mode {device_mode!r} at world {world_size} needs {need} NVIDIA GPU(s); sandbox "
            f"profile {profile!r} sees {len(hardware.gpus)}. Run it on a GPU host (profiles local-gpu, "
            "local-gpu-shared, docker-gpu); mode 'compile' builds without a GPU")


class JudgeClient:
    """Runs evaluations in one sandbox. Starts a warm judge server lazily when the profile asks for one."""

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self._server_socket: str | None = None
        # Only a client holding this may use the sandbox's judge server (it travels on stdin, never in argv).
        self._token = secrets.token_hex(16)

    def warm(self) -> None:
        """Start the sandbox's warm judge server now (torch imported once), not in the first evaluation."""
        self._ensure_server()

    def _ensure_server(self) -> str | None:
        if not self.sandbox.profile.warm_server:
            return None
        sock = os.path.join(self.sandbox.workdir, "judge.sock")
        if self._server_socket == sock:
            return sock
        res = self.sandbox.exec(judge_command(self.sandbox.python, "serve", "--socket", sock,
                                              "--owner-pid", str(self.sandbox.owner_pid)),
                                timeout=120, input=self._token.encode() + b"\n")
        if res.returncode != 0:
            try:
                log = self.sandbox.read_file(sock.replace(".sock", ".log")).decode(errors="replace")
            except SandboxError:
                log = ""
            raise JudgeInfraError(f"the judge server did not start in the sandbox (exit {res.returncode}):\n"
                                  f"{(res.stderr + log)[-2000:]}")
        self._server_socket = sock
        return sock

    def evaluate(self, task: Task, files: Mapping[str, str], mode: Mode, world_size: int, *,
                 device_mode: str | None = None, secret: bytes | None = None, static_check: bool = True,
                 timeout_s: float | None = None, worlds: int = 1) -> JudgeResult:
        """Judge `files` for `task`. Raises JudgeInfraError when the judge itself fails (never the agent's fault).

        `worlds` > 1: a `check` or `full` run that passes is checked again at up to `worlds - 1` other world sizes
        of the card (judge/host/worlds.py); the benchmark stays at `world_size`."""
        result = self._evaluate_one(task, files, mode, world_size, device_mode=device_mode, secret=secret,
                                    static_check=static_check, timeout_s=timeout_s)
        if worlds <= 1 or mode not in ("check", "full") or result.verdict != Verdict.passed:
            return result
        dev = device_mode or self.sandbox.profile.device_mode
        max_world = len(self.sandbox.hardware().gpus) if dev == "cuda" else None
        others = [self._evaluate_one(task, files, "check", w, device_mode=device_mode, static_check=static_check,
                                     timeout_s=timeout_s)
                  for w in other_worlds(task.card.world.sizes, world_size, worlds - 1, max_world)]
        return merge_worlds(result, others)

    def _evaluate_one(self, task: Task, files: Mapping[str, str], mode: Mode, world_size: int, *,
                      device_mode: str | None = None, secret: bytes | None = None, static_check: bool = True,
                      timeout_s: float | None = None) -> JudgeResult:
        if world_size not in task.card.world.sizes:
            raise CardError(f"{task.id} runs at world sizes {task.card.world.sizes}, not {world_size}")
        why = task.unsupported(mode)
        if why:
            raise CardError(f"{task.id}: {why}")
        self.require_devices(task, mode, world_size, device_mode)
        eval_dir = os.path.join(self.sandbox.workdir, "evals", uuid.uuid4().hex[:12])
        self.sandbox.write_files(dict(files), base=os.path.join(eval_dir, "candidate"))
        prof = self.sandbox.profile
        req = JudgeRequest(task=task.judge_spec(), mode=mode, world_size=world_size,
                           device_mode=device_mode or prof.device_mode,
                           secret=(secret or secrets.token_bytes(32)).hex(), workdir=eval_dir,
                           source_hash=source_hash(files), timeout_s=timeout_s, memory_mb=prof.limits.memory_mb,
                           threads_per_rank=prof.threads_per_rank, static_check=static_check,
                           accept_weak_isolation=prof.accept_weak_isolation, link_model=task.link_model(prof.link_model),
                           cache_dir=os.path.join(self.sandbox.workdir, "cuda-cache"))
        limit = (timeout_s or task.card.limits.timeout_s) + JUDGE_MARGIN_S
        args = ["run", "--timeout", str(limit)]
        server = self._ensure_server()
        if server:
            args += ["--server", server]
        res = self.sandbox.exec(judge_command(self.sandbox.python, *args), timeout=limit,
                                input=self._token.encode() + b"\n" + req.model_dump_json().encode())
        for line in reversed(res.stdout.splitlines()):
            if line.startswith(RESULT_MARK):
                result = JudgeResult.model_validate_json(line[len(RESULT_MARK):])
                result.hardware = {**self.sandbox.hardware().model_dump(), **result.hardware}
                return result
        why = "timed out" if res.timed_out else f"exited with code {res.returncode}"
        raise JudgeInfraError(f"the judge {why} without a result:\n{res.stderr[-3000:]}")

    def require_devices(self, task: Task, mode: str, world_size: int, device_mode: str | None = None) -> None:
        """Raise UnservableError if this sandbox lacks the GPUs a run of `task` in `mode` needs (compiling needs
        none): said before anything runs, instead of a run failing as if the candidate were wrong."""
        dev = device_mode or self.sandbox.profile.device_mode
        if mode != "compile":
            require_gpus(task, dev, world_size, self.sandbox.hardware(), self.sandbox.profile.name)

    def close(self) -> None:
        if self._server_socket and self.sandbox.alive:
            try:
                self.sandbox.exec(judge_command(self.sandbox.python, "stop", "--socket", self._server_socket),
                                  timeout=30, input=self._token.encode() + b"\n")
            except SandboxError:
                pass
        self._server_socket = None
