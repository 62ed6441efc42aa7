"""The local backend: a fresh temporary folder and plain processes with rlimits, each command in its own session.

It isolates time, memory, processes and files from the host only as far as rlimits and a private folder can;
use the docker backend for untrusted code on shared machines.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import SandboxError
from ..paths import package_parent
from .base import ExecResult, HardwareInfo, Sandbox
from .profiles import SandboxProfile

_PASS_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES")


def _cut(data: bytes, limit: int) -> tuple[str, bool]:
    if len(data) <= limit:
        return data.decode(errors="replace"), False
    half = limit // 2
    cut = len(data) - limit
    return (data[:half].decode(errors="replace") + f"\n[... {cut} bytes cut ...]\n"
            + data[-half:].decode(errors="replace")), True


FOLDER_PREFIX = "commbench-sandbox-"


def prune_folders() -> list[str]:
    """Remove the local sandbox folders whose owner process is gone (a killed run leaves its folder behind; its
    processes die with it). Folders of live processes are kept."""
    removed = []
    for d in sorted(Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*-*")):
        pid = d.name[len(FOLDER_PREFIX):].split("-", 1)[0]
        if not d.is_dir() or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # the owner lives
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(str(d))
    return removed


class LocalSandbox(Sandbox):
    def __init__(self, profile: SandboxProfile):
        self.profile = profile
        self._dir: Path | None = None
        self._hw: HardwareInfo | None = None

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._dir is None:
            # the owner's pid in the name: `commbench sandbox prune` removes folders whose owner was killed
            self._dir = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
            (self._dir / "tmp").mkdir()

    def close(self) -> None:
        d, self._dir = self._dir, None
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)  # a warm judge server sees its socket vanish and exits

    @property
    def alive(self) -> bool:
        return self._dir is not None and self._dir.is_dir()

    @property
    def workdir(self) -> str:
        if self._dir is None:
            raise SandboxError("sandbox is not started; call start() (env.reset() does)")
        return str(self._dir)

    @property
    def python(self) -> str:
        return self.profile.python or sys.executable

    # -- commands --------------------------------------------------------------------------------------
    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
        # this package first, then whatever the host's interpreter was told (e.g. a folder of extra wheels)
        pythonpath = os.pathsep.join(p for p in (str(package_parent()), os.environ.get("PYTHONPATH", "")) if p)
        env.update({"HOME": self.workdir, "TMPDIR": str(Path(self.workdir) / "tmp"), "PYTHONPATH": pythonpath,
                    "PYTHONDONTWRITEBYTECODE": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1",
                    "PYTHONUNBUFFERED": "1", "COMMBENCH_SANDBOX": self.workdir, "TORCH_CPP_LOG_LEVEL": "ERROR"})
        if self.profile.gpus.ids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in self.profile.gpus.ids)
        env.update(self.profile.env)
        if extra:
            env.update(extra)
        return env

    def _limits(self) -> None:
        lim = self.profile.limits

        def setl(which: int, value: int) -> None:
            soft, hard = resource.getrlimit(which)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            try:
                resource.setrlimit(which, (value, hard))
            except (ValueError, OSError):
                pass

        setl(resource.RLIMIT_CPU, lim.cpu_time_s)
        setl(resource.RLIMIT_NOFILE, lim.open_files)
        setl(resource.RLIMIT_CORE, 0)
        if os.getuid() != 0:
            setl(resource.RLIMIT_NPROC, lim.processes + _user_processes())

    def exec(self, cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
             cwd: str | None = None, input: bytes | None = None) -> ExecResult:
        timeout = min(timeout, self.profile.limits.exec_timeout_s)
        wd = Path(cwd) if cwd and os.path.isabs(cwd) else Path(self.workdir) / (cwd or "")
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(list(cmd), cwd=wd, env=self._env(env), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    preexec_fn=self._limits)
        except OSError as exc:
            raise SandboxError(f"could not start {cmd[0]!r} in the local sandbox: {exc}") from exc
        timed_out = False
        try:
            out, err = proc.communicate(input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            out, err = proc.communicate()
        finally:
            _kill_group(proc.pid)  # nothing started by the command outlives it (unless it left the session)
        limit = self.profile.limits.max_output_bytes
        so, t1 = _cut(out, limit)
        se, t2 = _cut(err, limit)
        return ExecResult(returncode=proc.returncode, stdout=so, stderr=se, timed_out=timed_out,
                          duration_s=time.monotonic() - t0, truncated=t1 or t2)

    # -- files ---------------------------------------------------------------------------------------
    def _path(self, path: str) -> Path:
        root = Path(self.workdir).resolve()
        p = (root / path).resolve()
        if root != p and root not in p.parents:
            raise SandboxError(f"path {path!r} leaves the sandbox's work folder")
        return p

    def write_files(self, files: Mapping[str, str | bytes], base: str = "") -> None:
        for name, content in files.items():
            p = self._path(os.path.join(base, name))
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content.encode() if isinstance(content, str) else content)

    def read_file(self, path: str) -> bytes:
        try:
            return self._path(path).read_bytes()
        except FileNotFoundError as exc:
            raise SandboxError(f"no file {path!r} in the sandbox") from exc

    def hardware(self) -> HardwareInfo:
        if self._hw is None:
            self._hw = local_hardware("local")
        return self._hw


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _user_processes() -> int:
    uid = os.getuid()
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def local_hardware(backend: str) -> HardwareInfo:
    from importlib import metadata

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor()
    mem = 0.0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        pass
    try:
        torch_v = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_v = ""
    gpus, driver = [], ""
    if shutil.which("nvidia-smi"):
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=10)
            for line in q.stdout.strip().splitlines():
                name, driver = [x.strip() for x in line.split(",", 1)]
                gpus.append(name)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
    return HardwareInfo(backend=backend, cpu_model=cpu, cpu_count=os.cpu_count() or 0, memory_gb=round(mem, 1),
                        gpus=gpus, driver=driver, torch=torch_v, python=platform.python_version(),
                        platform=platform.platform())
