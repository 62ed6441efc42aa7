"""How long one `env.step` in check mode takes, against a torchrun launch of the same check.

Prints, for world 2 and 4: the median step wall time split into its parts (judge exec + warm-server hand-off,
rank start, rendezvous, candidate run, verification), the reset and first-step costs, and the median wall time of
`torchrun --nproc_per_node N` running an equivalent standalone check script (how the anchor benchmarks launch each
evaluation), measured side by side in the same run, and the ratio.

    python benchmarks/step_latency.py [--steps 9] [--torchrun-runs 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import commbench_env  # noqa: F401
from commbench_env.cards import load_task
from commbench_env.episode.gym_env import CommBenchEnv

TASK = "p2p/ring_shift"

STANDALONE = textwrap.dedent('''
    import os
    import torch
    import torch.distributed as dist

    def ring_shift(x):
        rank, world = dist.get_rank(), dist.get_world_size()
        out = torch.empty_like(x)
        reqs = [dist.isend(x, (rank + 1) % world), dist.irecv(out, (rank - 1) % world)]
        for r in reqs:
            r.wait()
        return out

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    inputs = [torch.randn(1024, generator=torch.Generator().manual_seed(1000 + r)) for r in range(world)]
    y = ring_shift(inputs[rank])
    assert torch.equal(y, inputs[(rank - 1) % world]), "wrong"
    dist.barrier()
    dist.destroy_process_group()
''')


def bench_env(world: int, steps: int, console: Console, check_worlds: int = 1) -> dict:
    task = load_task(TASK)
    tmp = tempfile.mkdtemp()
    t0 = time.perf_counter()
    env = CommBenchEnv(task=TASK, world_size=world, max_turns=steps + 2, trace_dir=tmp, reference="none",
                       check_worlds=check_worlds)
    obs, info = env.reset(seed=0)
    reset_s = time.perf_counter() - t0
    action = {"tool": "check", "source": task.reference_source()}
    t0 = time.perf_counter()
    env.step(action)
    first_s = time.perf_counter() - t0
    rows = []
    for _ in range(steps):
        t0 = time.perf_counter()
        _, _, _, _, info = env.step(action)
        wall = time.perf_counter() - t0
        jr = info["judge_result"]
        assert jr["verdict"] == "pass", jr["summary"]
        tm = jr["timings"]
        rows.append({"wall": wall, "launch": tm["launch_s"], "rendezvous": tm["rendezvous_s"] + tm["load_s"],
                     "run": tm["run_s"], "verify": tm["verify_s"], "judge": tm["total_s"]})
    env.close()
    shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    med["exec"] = med["wall"] - med["judge"]
    med.update(reset=reset_s, first=first_s)
    return med


def bench_torchrun(world: int, runs: int) -> float | None:
    exe = shutil.which("torchrun")
    if not exe:
        return None
    d = Path(tempfile.mkdtemp())
    script = d / "check.py"
    script.write_text(STANDALONE)
    walls = []
    env = {"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1",
           "PATH": "/usr/bin:/bin:" + str(Path(sys.executable).parent)}
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run([exe, "--standalone", f"--nproc_per_node={world}", str(script)], capture_output=True,
                           text=True, env=env, cwd=d, timeout=300)
        walls.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise SystemExit(f"torchrun failed:\n{p.stderr[-2000:]}")
    shutil.rmtree(d, ignore_errors=True)
    return statistics.median(walls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--torchrun-runs", type=int, default=3)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--check-worlds", type=int, default=1, help="world sizes each check judges (1: the same work as "
                    "the torchrun script; episodes judge 2 by default, about twice the candidate run)")
    a = ap.parse_args()
    console = Console()
    table = Table(title=f"env.step in check mode on {TASK}, {a.check_worlds} world size(s) judged per check "
                        "(medians, seconds)")
    cols = ["world", "reset", "first step", "step", "exec+hand-off", "rank start", "rendezvous+load", "candidate run",
            "verification", "torchrun", "step / torchrun"]
    for c in cols:
        table.add_column(c, justify="right")
    for w in [int(x) for x in a.worlds.split(",")]:
        m = bench_env(w, a.steps, console, a.check_worlds)
        tr = bench_torchrun(w, a.torchrun_runs)
        ratio = f"{m['wall'] / tr:.3f}" if tr else "n/a"
        table.add_row(str(w), f"{m['reset']:.3f}", f"{m['first']:.3f}", f"{m['wall']:.3f}", f"{m['exec']:.3f}",
                      f"{m['launch']:.3f}", f"{m['rendezvous']:.3f}", f"{m['run']:.3f}", f"{m['verify']:.3f}",
                      f"{tr:.3f}" if tr else "n/a", ratio)
        console.print(f"world {w}: step {m['wall']:.3f} s vs torchrun {tr:.3f} s -> ratio {ratio} (target <= 0.2)"
                      if tr else f"world {w}: step {m['wall']:.3f} s (torchrun not found)")
    console.print(table)
    console.print("reset = sandbox start; first step also starts the warm judge server (torch import) once per "
                  "sandbox; later steps fork fresh ranks from it.")


if __name__ == "__main__":
    main()
