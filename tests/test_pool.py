"""The sandbox pool: topology-aware GPU choice, ports, 50 concurrent episodes with disjoint GPUs and ports,
recycling after a crash and an infrastructure failure, per-turn loans, fresh sandboxes per episode, no leaks.

There is no GPU here: the GPU inventory is injected (a GpuTopology), while the allocator (flock leases and the
topology choice) is the real one.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import socket
import sys
import types
from pathlib import Path

import pytest

from commbench_env.cards import load_task
from commbench_env.episode.gym_env import CommBenchEnv
from commbench_env.errors import SandboxError
from commbench_env.judge.host.result import JudgeResult, RankStatus, Verdict
from commbench_env.sandbox.pool import SandboxPool, recycle_reason
from commbench_env.run.rollouts import EpisodePool, EpisodeRequest
from commbench_env.sandbox import load_profile
from commbench_env.sandbox.gpus import NVLINK_BASE, PCIE_BASE, GpuLease, GpuTopology, nvml_topology
from commbench_env.sandbox.ports import PortLease, default_port_range

from .process_support import descendants, processes_naming, wait_until_gone
from .sandbox_support import require_docker

TASK = "p2p/ring_shift"
REFERENCE = load_task(TASK).reference_source()
CRASH = ("import faulthandler\nimport torch\nimport torch.distributed as dist\n\n\ndef ring_shift(x):\n"
         "    if dist.get_rank() == 0:\n        faulthandler._sigsegv()\n    return x.clone()\n")


def islands(n: int, size: int) -> GpuTopology:
    """n GPUs in NVLink islands of `size` (18 lanes inside), joined only through the CPUs (NVML level SYSTEM)."""
    links = {(a, b): NVLINK_BASE + 18 if a // size == b // size else PCIE_BASE - 50
             for a, b in itertools.combinations(range(n), 2)}
    return GpuTopology.of(range(n), links)


def cpu_profile_with_gpus(count: int):
    """local-cpu whose sandboxes each hold `count` GPUs (CPU ranks ignore them; the allocation is what is tested)."""
    prof = load_profile("local-cpu")
    return prof.model_copy(update={"gpus": prof.gpus.model_copy(update={"count": count})})


@pytest.fixture()
def locks(tmp_path):
    return {"gpu_lock_dir": tmp_path / "gpu-locks", "port_lock_dir": tmp_path / "port-locks"}


# -- GPU choice ---------------------------------------------------------------------------------------------------
def test_an_env_on_a_gpu_takes_it_for_each_judge_run_only(tmp_path, monkeypatch):
    """An env with its own sandbox on a GPU profile locks the GPU while the judge runs (so no episode on this host
    times calls beside another), and only then (so no episode waits on one that waits on its trainer)."""
    import threading

    from commbench_env.sandbox import gpus

    from commbench_env.sandbox import HardwareInfo
    from commbench_env.sandbox.local import LocalSandbox

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # one GPU, as nvidia-smi would list it (its ranks never run here)
    monkeypatch.setattr(gpus, "LOCK_DIR", tmp_path / "gpu-locks")
    # the sandbox must report that GPU too, or the env refuses the GPU profile before anything runs (UnservableError)
    monkeypatch.setattr(LocalSandbox, "hardware", lambda self: HardwareInfo(backend="local", gpus=["stand-in GPU"]))
    task = load_task("utility/allgather_varlen")
    env = CommBenchEnv(task=task, sandbox="local-gpu-shared", world_size=2, max_turns=4)
    try:
        env.reset()
        other = GpuLease.acquire(1, pool=[0], timeout_s=0)  # another episode's judge run holds the GPU
        step = threading.Thread(target=env.step, args=({"tool": "check", "source": task.reference_source()},),
                                daemon=True)
        step.start()
        step.join(8.0)  # such a check takes under 2 s here when the GPU is free
        assert step.is_alive() and env.last_result is None  # waiting for the GPU
        other.release()
        step.join(120.0)
        assert not step.is_alive() and env.last_result is not None  # judged once the GPU was free
        GpuLease.acquire(1, pool=[0], timeout_s=0).release()  # and the env no longer holds it between runs
    finally:
        env.close()
    prof = load_profile("local-gpu-shared")
    assert gpus.lock_ids(prof, 4) == [0] and gpus.lock_ids(load_profile("local-gpu"), 1) == [0]
    assert gpus.lock_ids(prof.model_copy(update={"gpus": prof.gpus.model_copy(update={"shared": True})}), 2) == []
    assert gpus.lock_ids(load_profile("local-cpu"), 2) == []


def test_topology_prefers_the_best_linked_set_and_falls_back():
    topo = islands(8, 4)
    assert topo.choose(list(range(8)), 4) == [0, 1, 2, 3]
    assert topo.choose([0, 1, 4, 5, 6, 7], 4) == [4, 5, 6, 7]  # the whole free island, not 0, 1 + two across
    assert topo.choose([0, 5, 6, 7], 2) == [5, 6]
    assert topo.choose([0, 5], 2) == [0, 5]
    assert topo.choose([0, 1, 4, 5], 4) == [0, 1, 4, 5]  # no island has 4 free: any free set
    assert topo.choose([3, 1, 7], 1) == [1]
    assert GpuTopology.of([0, 1, 2, 3]).choose([3, 2, 0], 2) == [0, 2]  # no link information: lowest ids
    big = islands(16, 8)  # C(16, 8) subsets is past the exhaustive limit: the greedy choice
    assert big.choose([0, 1, 2, 8, 9, 10, 11, 12, 13, 14, 15], 8) == list(range(8, 16))


def test_gpu_leases_follow_the_topology_and_never_overlap(tmp_path):
    topo = islands(8, 4)
    take = lambda n, **kw: GpuLease.acquire(n, pool=list(topo.ids), lock_dir=tmp_path, choose=topo.choose, **kw)
    a = take(2)
    b = take(2)
    c = take(4)
    assert (a.ids, b.ids, c.ids) == ([0, 1], [2, 3], [4, 5, 6, 7])
    with pytest.raises(SandboxError, match="no 1 free GPU"):
        take(1, timeout_s=0)
    a.release()
    c.release()
    assert take(3).ids == [4, 5, 6]  # three of the free island rather than 0, 1 and one across
    assert GpuLease.acquire(0, pool=[], lock_dir=tmp_path).ids == []  # CPU work needs none, on any host


def test_topology_read_from_nvml(monkeypatch):
    """nvml_topology against a fake pynvml module: GPUs 0-1 and 2-3 share 4 NVLink lanes, 0-3 are
    peer-to-peer through an NVSwitch, the rest meet at a PCIe host bridge."""
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    bus = ["00000000:07:00.0", "00000000:0f:00.0", "00000000:47:00.0", "00000000:4e:00.0"]
    lanes = {0: [1] * 4, 1: [0] * 4, 2: [3] * 4, 3: [2] * 4}
    nv.NVMLError = NVMLError
    nv.NVML_NVLINK_MAX_LINKS, nv.NVML_FEATURE_ENABLED = 18, 1
    nv.NVML_P2P_CAPS_INDEX_NVLINK, nv.NVML_P2P_STATUS_OK = 3, 0
    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 4
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus[h].encode())

    def link_state(h, link):
        if link >= len(lanes[h]):
            raise NVMLError("not supported")
        return 1

    nv.nvmlDeviceGetNvLinkState = link_state
    nv.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(busId=bus[lanes[h][link]].encode())
    nv.nvmlDeviceGetP2PStatus = lambda a, b, cap: 0 if {a, b} == {0, 3} else 1
    nv.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 30
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    topo = nvml_topology()
    assert topo.source == "nvml" and topo.ids == (0, 1, 2, 3)
    assert topo.score(0, 1) == topo.score(3, 2) == NVLINK_BASE + 4
    assert topo.score(0, 3) == NVLINK_BASE + 4  # through the switch: as many lanes as the GPUs have
    assert topo.score(1, 2) == PCIE_BASE - 30
    assert topo.choose([1, 2, 3], 2) == [2, 3]
    assert GpuTopology.detect([2, 3]).ids == (2, 3)


# -- ports ----------------------------------------------------------------------------------------------------------
def test_port_leases_are_disjoint_free_and_below_the_ephemeral_range(tmp_path):
    start, stop = default_port_range()
    eph = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert 1024 <= start < stop <= eph
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        busy.listen()
        # a range whose first port is taken by someone else: the lease skips it
        a = PortLease.acquire(2, port_range=(port, port + 50), lock_dir=tmp_path)
        b = PortLease.acquire(2, port_range=(port, port + 50), lock_dir=tmp_path)
    assert port not in a.ports + b.ports and not set(a.ports) & set(b.ports)
    a.release()
    b.release()


# -- the pool ---------------------------------------------------------------------------------------------------------
def test_gpus_needed_follow_the_device_mode():
    gpu = SandboxPool("local-gpu", gpus=GpuTopology.of(range(8)))
    shared = SandboxPool("local-gpu-shared", gpus=GpuTopology.of(range(8)))
    assert [gpu.gpus_needed(w) for w in (2, 4)] == [2, 4] and shared.gpus_needed(4) == 1
    assert SandboxPool("local-cpu").gpus_needed(4) == 0 and SandboxPool(cpu_profile_with_gpus(2)).gpus_needed(4) == 2
    with pytest.raises(SandboxError, match="9 GPU"):
        gpu.acquire(9)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(gpu)


def test_fifty_concurrent_episodes_share_no_gpu_or_port_and_leak_nothing(tmp_path, locks):
    """50 one-check episodes, 6 at a time, 2 (fake) GPUs per sandbox out of 8: at most 4 sandboxes can hold GPUs at
    once, so episodes also wait for GPUs. Checked three ways: the pool's loan log, the episodes themselves while they
    hold their sandbox, and the lock files afterwards."""
    before = descendants()
    pool = SandboxPool(cpu_profile_with_gpus(2), max_sandboxes=6, gpus=islands(8, 4), ports_per_sandbox=2, **locks)
    holding: dict[int, dict] = {}
    conflicts: list[str] = []
    first_four = asyncio.Event()

    class Agent:
        """Registers its sandbox's GPUs and ports from reset until its one action is handed over (a window inside
        its loan), and looks for anyone else holding the same ones. The first four wait for each other."""

        def __init__(self, req: EpisodeRequest):
            self.key = req.tag

        async def reset(self, obs, info):
            mine = info["sandbox"]
            for key, other in holding.items():
                if set(other["gpus"]) & set(mine["gpus"]) or set(other["ports"]) & set(mine["ports"]):
                    conflicts.append(f"episodes {key} and {self.key}: {other} vs {mine}")
            holding[self.key] = mine
            if len(holding) >= 4:
                first_four.set()

        async def act(self, obs, info):
            await asyncio.wait_for(first_four.wait(), timeout=120)  # four episodes hold sandboxes at once
            await asyncio.sleep(0.01)
            del holding[self.key]
            return {"tool": "check", "source": REFERENCE}

    async def main():
        async with EpisodePool(Agent, concurrency=6, sandbox_pool=pool,
                               env_kwargs={"max_turns": 1, "submit_on_truncation": False, "reference": "none",
                                           "trace_dir": str(tmp_path / "traces")}) as episodes:
            return await episodes.run([EpisodeRequest(TASK, world_size=2, tag=i) for i in range(50)])

    try:
        pool.warm(4, world_size=2)  # started in parallel before the first episode
        assert (pool.stats().started, pool.stats().idle) == (4, 4)
        outcomes = asyncio.run(main())
        assert not conflicts
        assert [o.verdict for o in outcomes] == ["pass"] * 50 and all(o.ok for o in outcomes)
        log = pool.lease_log()
        assert len(log) == 4 + 50 and all(r.released is not None for r in log)  # warm-up loans, then episodes
        overlapping = [(a, b) for a, b in itertools.combinations(log, 2)
                       if a.acquired < b.released and b.acquired < a.released]
        assert overlapping  # loans did run at the same time
        for a, b in overlapping:
            assert not set(a.gpus) & set(b.gpus), (a, b)
            assert not set(a.ports) & set(b.ports), (a, b)
        assert all(len(r.gpus) == 2 and r.gpus[0] // 4 == r.gpus[1] // 4 for r in log)  # both in one NVLink island
        stats = pool.stats()
        assert stats.episodes == 50 and stats.leases == 54 and stats.recycles == 0
        assert stats.started <= 6 and stats.busy_s > 0 and 0 < stats.utilisation <= 1
        assert sum(s.episodes for s in stats.sandboxes) == 50

        # what a sandbox sees: its ports (bindable) and its GPUs
        slot = pool.acquire(2)
        code = ("import os, socket\ns = socket.socket(); s.bind(('127.0.0.1', int(os.environ['MASTER_PORT'])))\n"
                "print(os.environ['COMMBENCH_PORTS'], os.environ['CUDA_VISIBLE_DEVICES'])")
        res = slot.sandbox.exec([slot.sandbox.python, "-c", code], timeout=60)
        assert res.stdout.split() == [",".join(map(str, slot.ports)), ",".join(map(str, slot.gpus))], res.stderr
        pool.release(slot, episode_end=False)
    finally:
        pool.close()
    assert wait_until_gone(lambda: processes_naming(pool.workdirs())) == []
    assert wait_until_gone(lambda: descendants() - before) == set()
    every = GpuLease.acquire(8, pool=list(range(8)), lock_dir=locks["gpu_lock_dir"], timeout_s=0)  # all free again
    every.release()


def test_recycles_after_a_crash_and_an_infrastructure_failure(tmp_path, locks):
    pool = SandboxPool("local-cpu", max_sandboxes=1, **locks)
    env = CommBenchEnv(task=TASK, world_size=2, max_turns=2, sandbox_pool=pool, static_check=False,
                       reference="none", submit_on_truncation=False, trace_dir=str(tmp_path))
    try:
        _, info = env.reset()
        first = info["sandbox"]["id"]
        _, _, _, _, info = env.step({"tool": "check", "source": CRASH})
        assert info["verdict"] == "runtime_error"
        assert info["judge_result"]["ranks"][0]["state"] == "crashed"
        _, info = env.reset()  # the crashed episode's sandbox is not lent again
        second = info["sandbox"]["id"]
        assert second != first

        env.episode._slot.sandbox.close()  # the sandbox dies under the episode
        with pytest.raises(SandboxError):
            env.step({"tool": "check", "source": REFERENCE})
        assert env.turn == 0  # the failed turn is not charged to the agent
        _, _, _, _, info = env.step({"tool": "check", "source": REFERENCE})  # a fresh sandbox takes over
        assert info["verdict"] == "pass" and info["sandbox"]["id"] not in (first, second)
        stats = pool.stats()
        reasons = [s.recycled for s in stats.sandboxes if s.recycled]
        assert stats.recycles == 2 and reasons[0].startswith("crash: rank 0 crashed")
        assert reasons[1].startswith("infrastructure")
    finally:
        env.close()
        pool.close()
    assert wait_until_gone(lambda: processes_naming(pool.workdirs())) == []


def test_idle_sandboxes_give_up_gpus_grouped_for_another_world(locks):
    """A cuda profile holds one GPU per rank: two idle 2-GPU sandboxes are closed to make one 4-GPU sandbox
    (no judge server here: nothing runs, only the lending is tested)."""
    prof = load_profile("local-gpu").model_copy(update={"warm_server": False})
    pool = SandboxPool(prof, max_sandboxes=3, gpus=islands(4, 2), **locks)
    try:
        a, b = pool.acquire(2), pool.acquire(2)
        assert (a.gpus, b.gpus) == ([0, 1], [2, 3])
        pool.release(a)
        pool.release(b)
        c = pool.acquire(4)
        assert c.gpus == [0, 1, 2, 3] and pool.stats().started == 3 and pool.stats().live == 1
        pool.release(c)
        again = pool.acquire(4)
        assert again is c  # reused, not restarted
        pool.release(again)
    finally:
        pool.close()


def test_recycle_reasons():
    base = {"task_id": "t", "task_hash": "h", "mode": "check", "world_size": 2}
    ok = JudgeResult(**base, device_mode="cuda", verdict=Verdict.wrong_answer)
    assert recycle_reason(ok) is None
    cuda = JudgeResult(**base, device_mode="cuda", verdict=Verdict.runtime_error,
                       ranks=[RankStatus(rank=1, state="error", stderr="RuntimeError: CUDA error: an illegal "
                                                                         "memory access was encountered")])
    assert recycle_reason(cuda).startswith("CUDA error")
    assert recycle_reason(JudgeResult(**base, device_mode="cpu", verdict=Verdict.timeout)).startswith("crash")
    assert recycle_reason(JudgeResult(**base, device_mode="cpu", verdict=Verdict.infra_error)).startswith("judge")


def test_turn_loans_let_many_episodes_share_one_sandbox(tmp_path, locks):
    """hold="turn": a sandbox is lent for one judge call, so three episodes in flight share one sandbox."""
    pool = SandboxPool("local-cpu", max_sandboxes=1, hold="turn", **locks)
    envs = [CommBenchEnv(task=TASK, world_size=2, max_turns=1, sandbox_pool=pool, reference="none",
                         submit_on_truncation=False, trace_dir=str(tmp_path)) for _ in range(3)]
    try:
        for e in envs:
            e.reset()
        infos = [e.step({"tool": "check", "source": REFERENCE})[4] for e in envs]
        assert [i["verdict"] for i in infos] == ["pass"] * 3
        assert len({i["sandbox"]["id"] for i in infos}) == 1
        stats = pool.stats()
        assert stats.started == 1 and stats.episodes == 3 and stats.leases == 4  # one more to read the hardware
        held = pool.acquire(2)
        with pytest.raises(SandboxError, match="no sandbox came free"):
            pool.acquire(2, timeout_s=0.3)
        pool.release(held, episode_end=False)
    finally:
        for e in envs:
            e.close()
        pool.close()


def test_a_fresh_sandbox_per_episode_when_not_reusing(tmp_path, locks):
    pool = SandboxPool("local-cpu", max_sandboxes=1, reuse=False, **locks)
    env = CommBenchEnv(task=TASK, world_size=2, max_turns=1, sandbox_pool=pool, reference="none",
                       submit_on_truncation=False, trace_dir=str(tmp_path))
    try:
        ids = []
        for _ in range(2):
            _, info = env.reset()
            ids.append(info["sandbox"]["id"])
            assert env.step({"tool": "check", "source": REFERENCE})[4]["verdict"] == "pass"
        assert ids[0] != ids[1] and pool.stats().recycles == 0
    finally:
        env.close()
        pool.close()
    assert wait_until_gone(lambda: processes_naming(pool.workdirs())) == []


@pytest.mark.docker
@pytest.mark.parametrize("reuse", [None, True])
def test_docker_pool_runs_episodes_and_removes_its_containers(tmp_path, locks, reuse):
    """docker-cpu asks for a fresh container per episode (reuse None); reuse=True lends containers again, emptied."""
    require_docker()
    from commbench_env.agents import load_agent
    from commbench_env.sandbox.docker_backend import LABEL, docker_client

    def ours():
        owner = f"{socket.gethostname()}:{os.getpid()}"
        return docker_client().containers.list(all=True, filters={"label": f"{LABEL}.owner={owner}"})

    pool = SandboxPool("docker-cpu", max_sandboxes=2, reuse=reuse, **locks)
    try:
        async def main():
            async with EpisodePool(lambda req: load_agent("reference", plan=["check:reference"]), concurrency=2,
                                   sandbox_pool=pool, env_kwargs={"max_turns": 1, "submit_on_truncation": False,
                                                                  "trace_dir": str(tmp_path)}) as episodes:
                return await episodes.run([EpisodeRequest(TASK, world_size=2)] * 4)

        outcomes = asyncio.run(main())
        assert [o.verdict for o in outcomes] == ["pass"] * 4
        stats = pool.stats()
        assert stats.episodes == 4 and stats.recycles == 0
        assert len({o.sandbox["id"] for o in outcomes}) == (4 if reuse is None else 2)
    finally:
        pool.close()
    assert ours() == []
