"""kill -9 of the process that holds an env, mid-episode: nothing of the evaluation outlives it, and
`commbench sandbox prune` removes the sandbox folder it left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HOLDER = textwrap.dedent("""
    from commbench_env.episode.gym_env import CommBenchEnv
    env = CommBenchEnv(task="collective/allreduce_ring", sandbox="local-cpu", max_turns=3, world_size=2,
                       reference="none")
    env.reset()
    print(env.episode._sandbox.workdir, flush=True)
    env.step({"tool": "check", "source": "def all_reduce(x):\\n    while True:\\n        pass\\n"})
""")


def _processes_under(folder: str) -> list[str]:
    out = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    return [ln for ln in out if folder in ln and " ps " not in ln]


def test_kill_9_mid_episode_leaves_no_process_and_prune_removes_the_folder():
    p = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    folder = p.stdout.readline().strip()
    assert folder and Path(folder).is_dir()
    deadline = time.monotonic() + 60  # the judge server and the ranks are up once the ranks' folders exist
    while time.monotonic() < deadline and not list(Path(folder).glob("**/rank1")):
        time.sleep(0.2)
    assert list(Path(folder).glob("**/rank1")), "the ranks never started"
    assert _processes_under(folder), "expected the judge server to run under the sandbox folder"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _processes_under(folder):
        time.sleep(0.2)
    assert not _processes_under(folder), _processes_under(folder)
    assert Path(folder).is_dir()  # kill -9 gave it no chance to clean up...
    out = subprocess.run([sys.executable, "-m", "commbench_env.cli", "sandbox", "prune"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert not Path(folder).exists() and folder in out.stdout  # ...prune does
