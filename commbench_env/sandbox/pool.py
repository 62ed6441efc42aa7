"""A pool of warm sandboxes on one host, shared by many concurrent episodes (DESIGN §9, one host).

Each pooled sandbox keeps a warm judge server and is lent to one episode at a time (or one turn at a time,
`hold="turn"`), then reset (its work folder emptied) and lent again. A sandbox is built for the GPUs it holds:
the pool leases them when it starts the sandbox (`GpuLease`, flock files, so pools in other processes on the
host never get the same GPU), choosing the free set with the best links (`GpuTopology`, from NVML), and leases
fixed ports for it (`PortLease`, exported as MASTER_PORT and COMMBENCH_PORTS). A sandbox is closed and replaced
after a CUDA error, a crashed or hung rank, a judge infrastructure failure, or when it died; profiles that ask for
a fresh sandbox per episode get one (started while other episodes run). `stats()` reports busy and idle time,
leases, episodes and recycles per sandbox.

    pool = SandboxPool("local-cpu", max_sandboxes=4)
    env = CommBenchEnv(task=..., sandbox_pool=pool)     # reset takes a sandbox, the episode's end gives it back
"""

from __future__ import annotations

import itertools
import shlex
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..config import StrictModel
from ..errors import SandboxError
from ..judge.host.client import JudgeClient
from ..judge.host.result import JudgeResult, Verdict
from . import HardwareInfo, Sandbox, SandboxProfile, load_profile, open_sandbox
from .gpus import GpuLease, GpuTopology
from .ports import PortLease

# Text in a rank's output or the verdict that means the GPU context (or the device) may be unusable afterwards.
CUDA_ERROR_MARKERS = ("CUDA error", "cudaError", "CUDA_ERROR", "illegal memory access", "device-side assert",
                      "unspecified launch failure", "NCCL error", "ncclUnhandledCudaError", "uncorrectable ECC",
                      "CUBLAS_STATUS_EXECUTION_FAILED")
KEEP_IN_WORKDIR = ("judge.sock", "judge.log", "cuda-cache", "tmp")


def recycle_reason(result: JudgeResult) -> str | None:
    """Why the sandbox that produced `result` should not run another evaluation (None: it is fine)."""
    if result.verdict == Verdict.infra_error:
        return "judge infrastructure error"
    bad = [r for r in result.ranks if r.state in ("crashed", "hung", "killed")]
    if result.verdict == Verdict.timeout or bad:
        who = ", ".join(f"rank {r.rank} {r.state}" for r in bad) or "timeout"
        return f"crash: {who}"
    if result.device_mode != "cpu":
        text = "\n".join([result.summary, *(r.stderr for r in result.ranks), *(c.error or "" for c in result.cases)])
        hit = next((m for m in CUDA_ERROR_MARKERS if m in text), None)
        if hit:
            return f"CUDA error ({hit})"
    return None


class SandboxStats(StrictModel):
    id: int
    backend: str
    gpus: list[int]
    ports: list[int]
    started_s: float = 0.0
    closed_s: float | None = None
    busy_s: float
    idle_s: float
    leases: int
    episodes: int
    recycled: str | None = None


class PoolStats(StrictModel):
    profile: str
    max_sandboxes: int
    live: int
    busy: int
    idle: int
    started: int
    recycles: int
    episodes: int
    leases: int
    busy_s: float
    idle_s: float
    utilisation: float
    wait_s: float
    sandboxes: list[SandboxStats]


@dataclass
class LeaseRecord:
    """One loan of a sandbox: which GPUs and ports it carried, and when (time.monotonic())."""

    slot: int
    gpus: tuple[int, ...]
    ports: tuple[int, ...]
    acquired: float
    released: float | None = None


@dataclass(eq=False)
class Slot:
    """A pooled sandbox with its judge client and the GPUs and ports it holds for its whole life."""

    id: int
    sandbox: Sandbox
    judge: JudgeClient
    gpus: list[int]
    ports: list[int]
    workdir: str
    _gpu_lease: GpuLease = field(repr=False)
    _port_lease: PortLease = field(repr=False)
    started: float = field(default_factory=time.monotonic)
    closed: float | None = None
    busy_since: float | None = None
    busy_s: float = 0.0
    leases: int = 0
    episodes: int = 0
    recycled: str | None = None
    _record: LeaseRecord | None = field(default=None, repr=False)


class _GpusBusy(Exception):
    pass


class SandboxPool:
    """Warm sandboxes of one profile, lent to episodes with disjoint GPUs and ports. Thread-safe.

    profile: a sandbox profile (name or object). max_sandboxes: live sandboxes at most (busy or idle).
    reuse: lend a sandbox again after an episode (default: unless the profile asks for a fresh one per episode).
    hold: "episode" (an env keeps its sandbox from reset to the episode's end) or "turn" (only while the judge
    runs: many episodes waiting on model calls share few sandboxes). gpus: the GPUs and their links (default:
    NVML / nvidia-smi, restricted to the profile's `gpus.ids`); tests inject a GpuTopology. ports_per_sandbox:
    fixed ports leased to each sandbox.
    """

    def __init__(self, profile: str | SandboxProfile = "local-cpu", *, max_sandboxes: int = 4,
                 reuse: bool | None = None, hold: Literal["episode", "turn"] = "episode",
                 gpus: GpuTopology | None = None, gpu_lock_dir: Path | None = None, ports_per_sandbox: int = 1,
                 port_range: tuple[int, int] | None = None, port_lock_dir: Path | None = None,
                 acquire_timeout_s: float = 3600.0, log_size: int = 10000):
        if max_sandboxes < 1:
            raise ValueError("max_sandboxes must be at least 1")
        if hold not in ("episode", "turn"):
            raise ValueError(f"hold must be 'episode' or 'turn', not {hold!r}")
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.max_sandboxes = max_sandboxes
        self.reuse = (not self.profile.fresh_per_episode) if reuse is None else reuse
        self.hold = hold
        self.ports_per_sandbox = ports_per_sandbox
        self.acquire_timeout_s = acquire_timeout_s
        self._topology = gpus
        self._gpu_lock_dir = gpu_lock_dir
        self._port_range = port_range
        self._port_lock_dir = port_lock_dir
        self._cond = threading.Condition()
        self._gpu_choice = threading.Lock()
        self._idle: list[Slot] = []
        self._live: dict[int, Slot] = {}
        self._all: list[Slot] = []
        self._starting = 0
        self._ids = itertools.count(1)
        self._log: deque[LeaseRecord] = deque(maxlen=log_size)
        self._bg: ThreadPoolExecutor | None = None  # starts replacements while episodes run
        self._wait_s = 0.0
        self._hw: HardwareInfo | None = None
        self._hw_lock = threading.Lock()
        self._closed = False
        self._t0 = time.monotonic()

    def __reduce__(self):
        raise TypeError("a SandboxPool holds this process's sandboxes and locks and cannot be pickled; pass its "
                        "settings as a dict (sandbox_pool={...}) and each process makes its own pool")

    # -- what an episode needs -------------------------------------------------------------------------
    @property
    def topology(self) -> GpuTopology:
        if self._topology is None:
            self._topology = GpuTopology.detect(self.profile.gpus.ids or None)
        return self._topology

    def gpus_needed(self, world_size: int) -> int:
        """GPUs one sandbox holds: none when the profile shares GPUs, else `gpus.count` if set, else one per rank
        (`cuda`), one for all ranks (`cuda-shared`), none (`cpu`)."""
        g = self.profile.gpus
        if g.shared:
            return 0
        if g.count:
            return g.count
        return {"cpu": 0, "cuda": world_size, "cuda-shared": 1}[self.profile.device_mode]

    # -- lending -----------------------------------------------------------------------------------------
    def acquire(self, world_size: int = 1, *, timeout_s: float | None = None) -> Slot:
        """A started sandbox with a warm judge, holding the GPUs `world_size` ranks need; waits for one."""
        need = self.gpus_needed(world_size)
        if need and need > len(self.topology.ids):
            raise SandboxError(f"{need} GPU(s) needed for world {world_size} with profile {self.profile.name!r}, "
                               f"but {len(self.topology.ids)} can be used here (the host's GPUs, within "
                               "CUDA_VISIBLE_DEVICES and the profile's gpus.ids); "
                               + ("run on a GPU host" if not self.topology.ids else "use a smaller world"))
        t_start = time.monotonic()
        deadline = t_start + (self.acquire_timeout_s if timeout_s is None else timeout_s)
        while True:
            evict: Slot | None = None
            slot: Slot | None = None
            with self._cond:
                self._check_open()
                slot = self._take_idle(lambda s: len(s.gpus) == need)
                if slot is None:
                    if len(self._live) + self._starting >= self.max_sandboxes:
                        evict = self._take_idle(lambda s: True)  # idle, but holding the wrong GPU count
                        if evict is None:
                            self._wait(deadline, "no sandbox came free")
                            continue
                    self._starting += 1
            if evict is not None:
                self._retire(evict, None)
            if slot is not None:
                if slot.sandbox.alive:
                    return self._lend(slot, t_start)
                self._retire(slot, "sandbox died while idle")
                continue
            try:
                slot = self._start_slot(need)
            except _GpusBusy:
                with self._cond:
                    self._starting -= 1
                    if any(len(s.gpus) == need for s in self._idle):
                        continue  # one came back meanwhile: take it
                    victim = self._take_idle(lambda s: bool(s.gpus))  # idle GPUs in the wrong grouping
                    if victim is None:
                        self._wait(deadline, f"{need} GPU(s) did not come free", poll=0.2)  # held elsewhere too
                        continue
                self._retire(victim, None)
                continue
            except BaseException:
                with self._cond:
                    self._starting -= 1
                    self._cond.notify_all()
                raise
            with self._cond:
                self._starting -= 1
                closed = self._closed
                if not closed:
                    self._live[slot.id] = slot
                    self._all.append(slot)
            if closed:
                self._close_slot(slot)
                raise SandboxError("the sandbox pool was closed")
            return self._lend(slot, t_start)

    def release(self, slot: Slot, *, recycle: str | None = None, episode_end: bool = True) -> None:
        """Give a sandbox back. `recycle`: why it must not be lent again (it is closed and counted as a recycle).
        `episode_end`: the loan ends an episode (the sandbox is reset, or replaced if the pool does not reuse)."""
        now = time.monotonic()
        with self._cond:
            if slot.busy_since is None:
                return  # already given back
            slot.busy_s += now - slot.busy_since
            slot.busy_since = None
            slot.episodes += int(episode_end)
            if slot._record is not None:
                slot._record.released = now
            closed = self._closed
        reason = recycle or (None if slot.sandbox.alive else "sandbox died")
        fresh = False  # the profile wants a new sandbox per episode: a replacement, not a recycle
        if reason is None and episode_end and not closed:
            if self.reuse:
                try:
                    self._reset(slot)
                except SandboxError as exc:
                    reason = f"reset failed: {exc}"
            else:
                fresh = True
        if reason is None and not fresh:
            with self._cond:
                if not self._closed:
                    self._idle.append(slot)
                    self._cond.notify_all()
                    return
        self._retire(slot, reason)
        if reason or fresh:
            self._prestart(len(slot.gpus))  # started in the background while other episodes run

    def warm(self, count: int, world_size: int = 1) -> None:
        """Start `count` sandboxes now (in parallel) so the first episodes do not wait for them."""
        count = min(count, self.max_sandboxes)
        with ThreadPoolExecutor(max_workers=max(1, count)) as ex:
            slots = list(ex.map(lambda _: self.acquire(world_size), range(count)))
        for s in slots:
            self.release(s, episode_end=False)

    def hardware(self, world_size: int = 1) -> HardwareInfo:
        """What the pool's sandboxes run on (asked of one sandbox, once)."""
        with self._hw_lock:  # concurrent first resets ask once
            if self._hw is None:
                slot = self.acquire(world_size)
                try:
                    self._hw = slot.sandbox.hardware()
                finally:
                    self.release(slot, episode_end=False)
        return self._hw

    # -- reporting ---------------------------------------------------------------------------------------
    def stats(self) -> PoolStats:
        now = time.monotonic()
        with self._cond:
            rows = []
            for s in self._all:
                end = s.closed if s.closed is not None else now
                busy = s.busy_s + (now - s.busy_since if s.busy_since is not None else 0.0)
                rows.append(SandboxStats(id=s.id, backend=self.profile.backend, gpus=s.gpus, ports=s.ports,
                                         started_s=s.started - self._t0,
                                         closed_s=None if s.closed is None else s.closed - self._t0,
                                         busy_s=busy, idle_s=max(0.0, end - s.started - busy), leases=s.leases,
                                         episodes=s.episodes, recycled=s.recycled))
            busy_s = sum(r.busy_s for r in rows)
            idle_s = sum(r.idle_s for r in rows)
            return PoolStats(profile=self.profile.name, max_sandboxes=self.max_sandboxes, live=len(self._live),
                             busy=sum(1 for s in self._live.values() if s.busy_since is not None),
                             idle=len(self._idle), started=len(self._all),
                             recycles=sum(1 for s in self._all if s.recycled), episodes=sum(r.episodes for r in rows),
                             leases=sum(r.leases for r in rows), busy_s=busy_s, idle_s=idle_s,
                             utilisation=busy_s / (busy_s + idle_s) if busy_s + idle_s > 0 else 0.0,
                             wait_s=self._wait_s, sandboxes=rows)

    def lease_log(self) -> list[LeaseRecord]:
        """The most recent loans (up to log_size), oldest first."""
        with self._cond:
            return list(self._log)

    def workdirs(self) -> list[str]:
        """Work folders of every sandbox this pool started (for leak checks)."""
        with self._cond:
            return [s.workdir for s in self._all]

    # -- lifetime ----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every sandbox (busy ones too: their episodes fail with a SandboxError). Idempotent."""
        with self._cond:
            self._closed = True
            bg, self._bg = self._bg, None
            self._cond.notify_all()
        if bg is not None:
            bg.shutdown(wait=True)  # a replacement being started is closed as soon as it is up
        with self._cond:
            slots = list(self._live.values())
            self._idle.clear()
        for s in slots:
            self._retire(s, None)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox pool was closed")

    def _wait(self, deadline: float, why: str, poll: float = 0.5) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SandboxError(f"{why} in pool {self.profile.name!r} within the acquire timeout "
                               f"({len(self._live)} live, max {self.max_sandboxes})")
        self._cond.wait(timeout=min(left, poll))

    def _take_idle(self, pred) -> Slot | None:
        for i in range(len(self._idle) - 1, -1, -1):  # most recently used first: warmest caches
            if pred(self._idle[i]):
                return self._idle.pop(i)
        return None

    def _lend(self, slot: Slot, t_start: float) -> Slot:
        now = time.monotonic()
        with self._cond:
            slot.busy_since = now
            slot.leases += 1
            self._wait_s += now - t_start
            slot._record = LeaseRecord(slot.id, tuple(slot.gpus), tuple(slot.ports), now)
            self._log.append(slot._record)
        return slot

    def _prestart(self, need: int) -> None:
        """Start a sandbox in the background and put it with the idle ones, if there is room."""
        with self._cond:
            if self._closed or len(self._live) + self._starting >= self.max_sandboxes:
                return
            self._starting += 1
            if self._bg is None:
                self._bg = ThreadPoolExecutor(max_workers=2, thread_name_prefix="commbench-pool")
            bg = self._bg

        def run() -> None:
            try:
                slot = self._start_slot(need)
            except Exception:  # noqa: BLE001 - GPUs busy, or a start failure the next acquire will report
                slot = None
            with self._cond:
                self._starting -= 1
                if slot is not None and not self._closed:
                    self._live[slot.id] = slot
                    self._all.append(slot)
                    self._idle.insert(0, slot)
                    slot = None
                self._cond.notify_all()
            if slot is not None:
                self._close_slot(slot)

        try:
            bg.submit(run)
        except RuntimeError:  # the pool is closing
            with self._cond:
                self._starting -= 1
                self._cond.notify_all()

    def _profile_for(self, gpu_ids: list[int], ports: list[int]) -> SandboxProfile:
        env = dict(self.profile.env)
        update: dict = {"env": env}
        if ports:
            env["MASTER_PORT"] = str(ports[0])
            env["COMMBENCH_PORTS"] = ",".join(map(str, ports))
        if gpu_ids:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the ids are NVML's / nvidia-smi's, which follow the PCI bus
            update["gpus"] = self.profile.gpus.model_copy(update={"ids": list(gpu_ids), "count": len(gpu_ids)})
        return self.profile.model_copy(update=update)

    def _start_slot(self, need: int) -> Slot:
        try:
            with self._gpu_choice:  # one choice at a time here, so each sees every GPU this pool has not leased
                gl = GpuLease.acquire(need, pool=list(self.topology.ids), timeout_s=0, lock_dir=self._gpu_lock_dir,
                                      choose=self.topology.choose) if need else GpuLease(ids=[])
        except SandboxError as exc:
            raise _GpusBusy(str(exc)) from exc
        pl: PortLease | None = None
        sb: Sandbox | None = None
        try:
            pl = PortLease.acquire(self.ports_per_sandbox, port_range=self._port_range, lock_dir=self._port_lock_dir)
            prof = self._profile_for(gl.ids, pl.ports)
            if prof.backend == "docker":
                from .docker_backend import DockerSandbox

                sb = DockerSandbox(prof, gpu_ids=list(gl.ids) or None)
            else:
                sb = open_sandbox(prof)
            sb.start()
            judge = JudgeClient(sb)
            if prof.warm_server:
                judge.warm()  # the judge server (torch imported) starts now, not in the first step
            return Slot(id=next(self._ids), sandbox=sb, judge=judge, gpus=list(gl.ids), ports=list(pl.ports),
                        workdir=sb.workdir, _gpu_lease=gl, _port_lease=pl)
        except BaseException:
            if sb is not None:
                sb.close()
            if pl is not None:
                pl.release()
            gl.release()
            raise

    def _reset(self, slot: Slot) -> None:
        """Between episodes: empty the work folder (the judge server, its log and the content-addressed build cache
        stay), and restart the judge client if its server has gone (idle timeout)."""
        wd = shlex.quote(slot.sandbox.workdir)
        keep = " ".join(f"! -name {n}" for n in KEEP_IN_WORKDIR)
        script = (f"find {wd} -mindepth 1 -maxdepth 1 {keep} -exec rm -rf {{}} + ; "
                  f"if [ -d {wd}/tmp ]; then find {wd}/tmp -mindepth 1 -delete; fi; "
                  f"test -S {wd}/judge.sock && echo warm || echo cold")
        res = slot.sandbox.exec(["sh", "-c", script], timeout=60)
        if res.returncode != 0:
            raise SandboxError(f"could not empty the work folder: {res.stderr[-300:]}")
        if slot.sandbox.profile.warm_server and res.stdout.strip().endswith("cold"):
            slot.judge = JudgeClient(slot.sandbox)
            slot.judge.warm()

    def _retire(self, slot: Slot, reason: str | None) -> None:
        with self._cond:
            if slot.closed is not None:
                return
            slot.closed = time.monotonic()
            if slot.busy_since is not None:
                slot.busy_s += slot.closed - slot.busy_since
                slot.busy_since = None
            if reason:
                slot.recycled = reason
            self._live.pop(slot.id, None)
            if slot in self._idle:
                self._idle.remove(slot)
            self._cond.notify_all()
        self._close_slot(slot)

    @staticmethod
    def _close_slot(slot: Slot) -> None:
        try:
            slot.judge.close()
        except Exception:  # noqa: BLE001 - a dead sandbox cannot stop its server; closing it stops everything
            pass
        slot.sandbox.close()
        slot._port_lease.release()
        slot._gpu_lease.release()
