"""The docker backend for real: isolation settings, attacks in a real container, clean-up, GPU configuration."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from commbench_env.cards import load_task
from commbench_env.judge.host.client import JudgeClient
from commbench_env.judge.host.result import Verdict
from commbench_env.sandbox import load_profile, open_sandbox
from commbench_env.sandbox.docker_backend import LABEL, container_config, docker_client, prune
from commbench_env.sandbox.gpus import GpuLease

from .sandbox_support import require_docker

pytestmark = pytest.mark.docker


@pytest.fixture()
def sb():
    require_docker()
    s = open_sandbox("docker-cpu")
    s.start()
    yield s
    s.close()


def ours() -> list:
    return docker_client().containers.list(all=True, filters={"label": LABEL})


def test_isolation_settings_visible_in_inspect(sb):
    attrs = docker_client().api.inspect_container(sb.container_id)
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    assert host["PidsLimit"] == load_profile("docker-cpu").limits.processes
    assert host["Memory"] == load_profile("docker-cpu").docker.memory_mb << 20
    assert attrs["Config"]["User"] == "65534:65534"
    assert "/sandbox" in host["Tmpfs"] and "size=" in host["Tmpfs"]["/sandbox"]


def test_no_network(sb):
    code = ("import socket\ns = socket.socket(); s.settimeout(3)\n"
            "try:\n    s.connect(('192.0.2.1', 80)); print('connected')\nexcept OSError as e:\n    print('refused', e)\n")
    res = sb.exec([sb.python, "-c", code], timeout=30)
    assert "refused" in res.stdout and "connected" not in res.stdout
    res = sb.exec(["cat", "/proc/net/dev"], timeout=30)
    assert [ln.split(":")[0].strip() for ln in res.stdout.splitlines()[2:]] == ["lo"]


def test_no_writes_outside_the_workdir(sb):
    for path in ("/etc/evil", "/usr/evil", "/opt/commbench/evil", "/opt/commbench-src/commbench_env/evil.py"):
        res = sb.exec(["sh", "-c", f"echo x > {path}"], timeout=30)
        assert res.returncode != 0, path
    assert sb.exec(["sh", "-c", "echo x > /sandbox/ok && cat /sandbox/ok"], timeout=30).stdout.strip() == "x"
    assert sb.exec(["id", "-u"], timeout=30).stdout.strip() == "65534"


def test_fork_bomb_is_contained(sb):
    bomb = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n"
            "            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('stopped after', n, e)\n")
    res = sb.exec([sb.python, "-c", bomb], timeout=60)
    assert "stopped after" in res.stdout
    assert int(res.stdout.split()[2]) < load_profile("docker-cpu").limits.processes
    assert sb.exec(["true"], timeout=30).returncode in (0, 126)  # may still be crowded, but the container lives
    assert sb.alive


def test_memory_hog_is_killed(sb):
    res = sb.exec([sb.python, "-c", "b = bytearray(16 << 30); print('allocated')"], timeout=120)
    assert res.returncode != 0 and "allocated" not in res.stdout


def test_judge_in_a_container(sb):
    task = load_task("collective/allreduce_ring")
    client = JudgeClient(sb)
    try:
        ok = client.evaluate(task, {"solution.py": task.reference_source()}, "check", 4)
        assert ok.verdict == Verdict.passed and ok.hardware["backend"] == "docker"
        hang = client.evaluate(task, {"solution.py": "import torch\n\ndef all_reduce(x):\n    while True:\n        pass\n"},
                               "check", 2, timeout_s=3)
        assert hang.verdict == Verdict.timeout and "did not finish" in hang.summary
        again = client.evaluate(task, {"solution.py": task.reference_source()}, "check", 2)
        assert again.verdict == Verdict.passed  # the next evaluation is unaffected
    finally:
        client.close()


def test_container_removed_after_an_episode():
    require_docker()
    from commbench_env.episode.gym_env import CommBenchEnv

    env = CommBenchEnv(task="p2p/ring_shift", sandbox="docker-cpu", world_size=2, max_turns=2)
    env.reset()
    cid = env.episode._sandbox.container_id
    _, reward, term, _, info = env.step({"tool": "submit", "source": load_task("p2p/ring_shift").reference_source()})
    assert term and info["verdict"] == "pass" and reward > 0.5
    env.close()
    assert cid not in {c.id for c in ours()}  # only its own container: others may share the engine


def test_sigterm_stops_a_docker_eval_and_removes_its_containers(tmp_path):
    """SIGTERM to `commbench eval` in docker-cpu while an episode plays: it stops within 20 s and no container it
    owned is left (each is labelled with its owner's pid)."""
    require_docker()
    import json
    import socket
    import time

    cmd = [sys.executable, "-m", "commbench_env.cli", "eval", "--agent", "reference", "--sandbox", "docker-cpu",
           "--tasks", "p2p/ring_shift,collective/allreduce_ring,utility/barrier_p2p", "--world", "2",
           "--out", str(tmp_path)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    owner = f"{socket.gethostname()}:{p.pid}"

    def owned() -> list:
        return [c for c in ours() if c.labels.get("commbench.sandbox.owner") == owner]

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not owned():
        time.sleep(0.2)
    assert owned(), "the eval never started a container"
    time.sleep(2.0)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, errs = p.communicate(timeout=60)
    assert time.monotonic() - t0 < 20 and p.returncode == 130, errs
    assert not owned(), "a container of the stopped run is still there"
    recs = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()] \
        if (tmp_path / "results.jsonl").is_file() else []
    assert all(r["status"] in ("done", "interrupted") for r in recs)


def test_killed_parent_leaves_an_orphan_that_prune_removes():
    require_docker()
    code = ("from commbench_env.sandbox import open_sandbox\nimport sys, time\n"
            "s = open_sandbox('docker-cpu'); s.start(); print(s.container_id, flush=True); time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    cid = p.stdout.readline().strip()
    assert cid
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert cid in {c.id for c in ours()}  # SIGKILL leaves no chance to clean up...
    removed = prune()
    assert cid[:12] in removed and cid not in {c.id for c in ours()}  # ...prune does


def test_sigterm_removes_the_container():
    require_docker()
    code = ("from commbench_env.sandbox import open_sandbox\nimport sys, time\n"
            "s = open_sandbox('docker-cpu'); s.start(); print(s.container_id, flush=True); time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    cid = p.stdout.readline().strip()
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
    time.sleep(0.5)
    assert cid not in {c.id for c in ours()}


def test_gpu_container_configuration():
    prof = load_profile("docker-gpu")
    cfg = container_config(prof, "commbench-cuda:test", gpu_ids=[2, 3])
    (req,) = cfg["device_requests"]
    assert req["DeviceIDs"] == ["2", "3"] and req["Capabilities"] == [["gpu"]]
    assert cfg["ipc_mode"] == "private" and cfg["shm_size"] == f"{prof.docker.shm_mb}m"
    memlock = [u for u in cfg["ulimits"] if u["Name"] == "memlock"][0]
    assert memlock["Soft"] == -1 and memlock["Hard"] == -1
    assert cfg["network_mode"] == "none" and cfg["environment"]["NCCL_NVLS_ENABLE"] == "0"
    every = container_config(prof, "commbench-cuda:test")["device_requests"][0]
    assert every["Count"] == -1


def test_gpu_leases_are_disjoint(tmp_path):
    a = GpuLease.acquire(2, pool=[0, 1, 2, 3], lock_dir=tmp_path)
    b = GpuLease.acquire(2, pool=[0, 1, 2, 3], lock_dir=tmp_path)
    assert not set(a.ids) & set(b.ids) and len(a.ids) == len(b.ids) == 2
    with pytest.raises(Exception):
        GpuLease.acquire(1, pool=[0, 1, 2, 3], lock_dir=tmp_path, timeout_s=0.5)
    a.release()
    c = GpuLease.acquire(2, pool=[0, 1, 2, 3], lock_dir=tmp_path)
    assert set(c.ids) == set(a.ids)
    b.release()
    c.release()


@pytest.mark.parametrize("name,verdicts", [
    ("runtime_socket_channel", {"forbidden"}),
    ("runtime_file_channel", {"forbidden"}),
    ("runtime_subprocess", {"forbidden"}),
    ("runtime_sigterm_sleep", {"timeout"}),
])
def test_attacks_fail_cleanly_in_a_container(sb, name, verdicts):
    """The judge's own layers still hold in a container (static check off: the run-time layers alone)."""
    from .conftest import ATTACKS

    task = load_task("collective/allreduce_ring")
    client = JudgeClient(sb)
    try:
        res = client.evaluate(task, {"solution.py": (ATTACKS / f"{name}.py").read_text()}, "check", 2,
                              static_check=False, timeout_s=4)
    finally:
        client.close()
    assert res.verdict.value in verdicts, res.feedback()


@pytest.mark.parametrize("name,marker", [("secret_scan", "LEAKED"), ("stdout_channel", "READ-PEER"),
                                         ("proc_peek", "PROC-LEAK"), ("detached_child", "SPAWNED\n")])
def test_trust_boundary_holds_in_a_container(sb, name, marker):
    """The kernel layers (spawner, Landlock, seccomp) hold inside the container too, static check off."""
    from .conftest import ATTACKS

    task = load_task("collective/allreduce_ring")
    client = JudgeClient(sb)
    try:
        res = client.evaluate(task, {"solution.py": (ATTACKS / "kernel" / f"{name}.py").read_text()}, "check", 2,
                              static_check=False)
    finally:
        client.close()
    out = "\n".join(r.stdout for r in res.ranks)
    assert res.ranks and marker not in out, out
    assert res.isolation.get("seccomp") is True and res.isolation.get("landlock_abi", 0) >= 1, res.isolation
    assert res.leaderboard_grade


def test_a_detached_process_leaves_nothing_after_close():
    """An episode whose submission tries to leave a detached process behind: after env.close() there is no such
    process on the host and no container of the episode."""
    require_docker()
    from commbench_env.episode.gym_env import CommBenchEnv

    from .conftest import ATTACKS

    env = CommBenchEnv(task="collective/allreduce_ring", sandbox="docker-cpu", world_size=2, max_turns=2,
                       static_check=False)
    env.reset()
    cid = env.episode._sandbox.container_id
    env.step({"tool": "check", "source": (ATTACKS / "kernel" / "detached_child.py").read_text()})
    env.close()
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", "commbench-detached-marker"], capture_output=True, text=True)
    assert not left.stdout.strip(), left.stdout
    assert cid not in {c.id for c in ours()}
