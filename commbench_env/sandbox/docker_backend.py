"""The docker backend: one container per sandbox, commands through `docker exec`, files through the archive API.

The container has no network, a read-only root, a size-limited writable work folder, a non-root user, no
capabilities, `no-new-privileges`, memory/CPU/pids limits from the profile, and a label naming its owner so that
`commbench sandbox prune` removes containers whose owner died. GPUs are passed with Docker's device requests.
"""

from __future__ import annotations

import atexit
import io
import os
import signal
import socket
import struct
import tarfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import SandboxError
from .base import ExecResult, HardwareInfo, Sandbox
from .engine import docker_client
from .local import _cut, local_hardware
from .profiles import SandboxProfile

LABEL = "commbench.sandbox"
WORKDIR = "/sandbox"
USER = "65534:65534"  # nobody
_LIVE: "weakref.WeakSet[DockerSandbox]" = weakref.WeakSet()
_IMAGE_TORCH: dict[str, str] = {}


def container_config(profile: SandboxProfile, image: str, gpu_ids: list[int] | None = None) -> dict[str, Any]:
    """Keyword arguments for containers.run: everything isolation depends on, in one testable place."""
    lim = profile.limits
    d = profile.docker
    cfg: dict[str, Any] = {
        "image": image, "command": ["sleep", "infinity"], "detach": True, "init": True,
        "network_mode": "none", "read_only": True, "user": USER, "working_dir": WORKDIR,
        "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"],
        "tmpfs": {WORKDIR: f"rw,exec,nosuid,nodev,size={d.workdir_mb}m,mode=0700,uid=65534,gid=65534",
                  "/tmp": "rw,nosuid,nodev,size=64m,mode=1777"},
        "mem_limit": f"{d.memory_mb}m", "memswap_limit": f"{d.memory_mb}m", "pids_limit": lim.processes,
        "nano_cpus": int(d.cpus * 1e9) if d.cpus else None,
        "labels": {LABEL: "1", f"{LABEL}.owner": f"{socket.gethostname()}:{os.getpid()}",
                   f"{LABEL}.profile": profile.name},
        "environment": {"HOME": WORKDIR, "TMPDIR": "/tmp", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1",
                        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "TORCH_CPP_LOG_LEVEL": "ERROR",
                        **profile.env},
        "ulimits": [], "shm_size": f"{d.shm_mb}m",
    }
    if d.mount_package:
        from ..paths import PACKAGE_DIR

        cfg["volumes"] = {str(PACKAGE_DIR): {"bind": "/opt/commbench-src/commbench_env", "mode": "ro"}}
        cfg["environment"]["PYTHONPATH"] = "/opt/commbench-src"
    if profile.device_mode != "cpu":
        import docker.types as dt

        ids = gpu_ids if gpu_ids is not None else profile.gpus.ids
        req = (dt.DeviceRequest(device_ids=[str(i) for i in ids], capabilities=[["gpu"]]) if ids
               else dt.DeviceRequest(count=profile.gpus.count or -1, capabilities=[["gpu"]]))
        cfg["device_requests"] = [req]
        cfg["ipc_mode"] = "private"  # ranks share the container's IPC namespace: CUDA IPC and NCCL's shm work
        cfg["ulimits"] = [dt.Ulimit(name="memlock", soft=-1, hard=-1), dt.Ulimit(name="stack", soft=67108864,
                                                                                 hard=67108864)]
    cfg = {k: v for k, v in cfg.items() if v is not None}
    return cfg


class DockerSandbox(Sandbox):
    def __init__(self, profile: SandboxProfile, gpu_ids: list[int] | None = None):
        self.profile = profile
        self.gpu_ids = gpu_ids
        self._container = None
        self._client = None
        self._hw: HardwareInfo | None = None
        self._lock = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._container is not None:
            return
        from .images import image_for

        self._client = docker_client()
        image = image_for(self.profile, self._client)
        if self.gpu_ids is None and self.profile.device_mode != "cpu" and self.profile.gpus.count and \
                not self.profile.gpus.shared:
            from .gpus import GpuLease

            self._lease = GpuLease.acquire(self.profile.gpus.count)  # disjoint from every other episode here
            self.gpu_ids = self._lease.ids
        try:
            self._container = self._client.containers.run(**container_config(self.profile, image, self.gpu_ids))
        except Exception as exc:  # noqa: BLE001
            raise SandboxError(f"could not start a container from {image}: {exc}") from exc
        _LIVE.add(self)
        _install_cleanup()

    def close(self) -> None:
        with self._lock:
            c, self._container = self._container, None
        if c is not None:
            try:
                c.remove(force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        lease, self._lease = getattr(self, "_lease", None), None
        if lease is not None:
            lease.release()

    @property
    def alive(self) -> bool:
        if self._container is None:
            return False
        try:
            self._container.reload()
            return self._container.status == "running"
        except Exception:  # noqa: BLE001
            return False

    @property
    def container_id(self) -> str:
        if self._container is None:
            raise SandboxError("sandbox is not started; call start() (env.reset() does)")
        return self._container.id

    @property
    def workdir(self) -> str:
        return WORKDIR

    @property
    def python(self) -> str:
        return self.profile.python or "python3"

    @property
    def owner_pid(self) -> int:
        return 0  # the container's lifetime bounds every process in it

    # -- commands --------------------------------------------------------------------------------------
    def exec(self, cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
             cwd: str | None = None, input: bytes | None = None) -> ExecResult:
        timeout = min(timeout, self.profile.limits.exec_timeout_s)
        api = self._client.api
        # `timeout` in the container kills the command's whole process group with SIGKILL at the limit
        wrapped = ["timeout", "-s", "KILL", f"{timeout:.0f}", *cmd]
        workdir = cwd if cwd and cwd.startswith("/") else f"{WORKDIR}/{cwd or ''}".rstrip("/")
        t0 = time.monotonic()
        try:
            ex = api.exec_create(self.container_id, wrapped, stdin=input is not None, stdout=True, stderr=True,
                                 environment=dict(env or {}), workdir=workdir, user=USER)
            sock = api.exec_start(ex["Id"], socket=True)
        except Exception as exc:  # noqa: BLE001
            raise SandboxError(f"docker exec failed: {exc}") from exc
        raw = getattr(sock, "_sock", sock)
        raw.settimeout(timeout + 30)
        timed_out = False
        try:
            if input is not None:
                raw.sendall(input)
                raw.shutdown(socket.SHUT_WR)
            out, err = _read_multiplexed(raw)
        except socket.timeout:
            timed_out, out, err = True, b"", b"host-side timeout waiting for the command"
        finally:
            raw.close()
        info = api.exec_inspect(ex["Id"])
        code = info.get("ExitCode")
        code = -9 if code is None else code
        timed_out = timed_out or code == 137 and time.monotonic() - t0 >= timeout - 0.5
        limit = self.profile.limits.max_output_bytes
        so, t1 = _cut(out, limit)
        se, t2 = _cut(err, limit)
        return ExecResult(returncode=code, stdout=so, stderr=se, timed_out=timed_out,
                          duration_s=time.monotonic() - t0, truncated=t1 or t2)

    # -- files ---------------------------------------------------------------------------------------
    # Through exec and tar on stdin/stdout: Docker's archive API cannot reach a tmpfs mount (it writes beneath it).
    def _abs(self, path: str) -> str:
        p = os.path.normpath(path if path.startswith("/") else f"{WORKDIR}/{path}")
        if not (p == WORKDIR or p.startswith(WORKDIR + "/")):
            raise SandboxError(f"path {path!r} leaves the sandbox's work folder")
        return p

    def write_files(self, files: Mapping[str, str | bytes], base: str = "") -> None:
        buf = io.BytesIO()
        root = self._abs(base or WORKDIR)
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, content in files.items():
                rel = os.path.relpath(self._abs(os.path.join(root, name)), WORKDIR)
                data = content.encode() if isinstance(content, str) else content
                ti = tarfile.TarInfo(rel)
                ti.size, ti.mode, ti.mtime = len(data), 0o644, int(time.time())
                tar.addfile(ti, io.BytesIO(data))
        res = self.exec(["tar", "-x", "--no-same-owner", "-C", WORKDIR], timeout=120, input=buf.getvalue())
        if res.returncode != 0:
            raise SandboxError(f"could not copy files into the container: {res.stderr[-500:]}")

    def read_file(self, path: str) -> bytes:
        p = self._abs(path)
        out = self._exec_bytes(["cat", "--", p], timeout=120)
        if out is None:
            raise SandboxError(f"no file {path!r} in the sandbox")
        return out

    def _exec_bytes(self, cmd: list[str], timeout: float) -> bytes | None:
        api = self._client.api
        ex = api.exec_create(self.container_id, cmd, stdout=True, stderr=True, user=USER)
        sock = api.exec_start(ex["Id"], socket=True)
        raw = getattr(sock, "_sock", sock)
        raw.settimeout(timeout)
        try:
            out, _ = _read_multiplexed(raw)
        finally:
            raw.close()
        return out if api.exec_inspect(ex["Id"]).get("ExitCode") == 0 else None

    def hardware(self) -> HardwareInfo:
        """The host's hardware with the image's torch version (asked once per image, not per container)."""
        if self._hw is None:
            image = self._container.attrs["Config"]["Image"]
            if image not in _IMAGE_TORCH:
                res = self.exec([self.python, "-c", "import torch; print(torch.__version__)"], timeout=120)
                _IMAGE_TORCH[image] = res.stdout.strip() if res.returncode == 0 else ""
            hw = local_hardware("docker")
            hw.torch = _IMAGE_TORCH[image]
            self._hw = hw
        return self._hw


def _read_multiplexed(sock) -> tuple[bytes, bytes]:
    """Docker's stream framing: 8-byte headers (stream id, size) before each chunk."""
    out, err = bytearray(), bytearray()
    buf = b""
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 8:
            kind, size = struct.unpack(">BxxxL", buf[:8])
            if len(buf) < 8 + size:
                break
            (err if kind == 2 else out).extend(buf[8:8 + size])
            buf = buf[8 + size:]
    return bytes(out), bytes(err)


_CLEANUP_INSTALLED = False


def _cleanup_all() -> None:
    for sb in list(_LIVE):
        sb.close()


def _install_cleanup() -> None:
    """Remove our containers at exit and on SIGTERM/SIGINT; a SIGKILLed parent leaves them to `sandbox prune`."""
    global _CLEANUP_INSTALLED
    if _CLEANUP_INSTALLED:
        return
    _CLEANUP_INSTALLED = True
    atexit.register(_cleanup_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM,):
            prev = signal.getsignal(sig)

            def handler(signum, frame, prev=prev):
                _cleanup_all()
                if callable(prev):
                    prev(signum, frame)
                else:
                    raise SystemExit(128 + signum)

            signal.signal(sig, handler)


def prune(all_containers: bool = False) -> list[str]:
    """Remove commbench containers whose owner process on this host is gone (or all of them)."""
    client = docker_client()
    removed = []
    host = socket.gethostname()
    for c in client.containers.list(all=True, filters={"label": LABEL}):
        owner = c.labels.get(f"{LABEL}.owner", "")
        h, _, pid = owner.partition(":")
        alive = False
        if h == host and pid.isdigit():
            try:
                os.kill(int(pid), 0)
                alive = True
            except ProcessLookupError:
                alive = False
            except PermissionError:
                alive = True
        if all_containers or not alive:
            c.remove(force=True)
            removed.append(c.short_id)
    return removed
