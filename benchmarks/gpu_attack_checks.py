"""Cheating submissions judged on a GPU: CUDA sources in tests/attacks/cuda/private/ and tests/attacks/cuda/symbols/
(their `EXPECT:` line names the verdict, or for symbols the refused imports), and the torch trust-boundary attacks
of tests/attacks/kernel/ in a GPU device mode. Every one must score zero (or fail at what it tried: no leak, no
process left). Run on a GPU machine; `cuda-shared` needs one GPU.

    python benchmarks/gpu_attack_checks.py [--mode cuda-shared] [--world 2] [--out FILE.md]

Exit status 1 if any attack scored above zero or leaked.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from commbench_env.cards import load_task
from commbench_env.judge.host.client import JudgeClient
from commbench_env.score.reward import compute_reward
from commbench_env.sandbox import GPU_PROFILE_FOR_MODE, load_profile, open_sandbox

ROOT = Path(__file__).resolve().parents[1] / "tests" / "attacks"
# The torch attacks define all_reduce(x); on a GPU they run as the entry point of a torch task that declares
# cuda-shared (the process boundary is what they attack, not the task), whose output they then get wrong.
TORCH_TASK = "utility/allgather_varlen"
# torch attack -> a marker in the ranks' stdout that means it got through
LEAK_MARKERS = {"secret_scan": "LEAKED", "stdout_channel": "READ-PEER", "proc_peek": "PROC-LEAK",
                "detached_child": "SPAWNED\n"}


def header(path: Path, key: str) -> str:
    return next((ln.split(":", 1)[1].strip() for ln in path.read_text().splitlines()
                 if ln.startswith((f"// {key}:", f"# {key}:"))), "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="cuda-shared", choices=["cuda-shared", "cuda"])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--out", help="also write the table as Markdown here")
    a = ap.parse_args()
    profile = load_profile(GPU_PROFILE_FOR_MODE[a.mode])
    rows, bad = [], []
    with open_sandbox(profile) as sb:
        client = JudgeClient(sb)
        cases = [(p, load_task(header(p, "TASK"))) for p in sorted((ROOT / "cuda" / "private").glob("*.cu"))]
        cases += [(p, load_task(header(p, "TASK") or "p2p/ipc_push_copy"))
                  for p in sorted((ROOT / "cuda" / "symbols").glob("*.cu"))]
        cases += [(p, load_task(TORCH_TASK)) for p in sorted((ROOT / "kernel").glob("*.py"))]
        for path, task in cases:
            if a.mode not in [m.value for m in task.card.world.device_modes]:
                continue
            t0 = time.monotonic()
            source = path.read_text()
            if path.suffix == ".py":
                source += f"\n\n{task.card.entry.functions[0]} = all_reduce\n"
            res = client.evaluate(task, {task.card.entry.file: source}, "full", a.world,
                                  device_mode=a.mode, static_check=path.suffix == ".cu")
            reward = compute_reward(res, None).reward
            out = "\n".join(r.stdout for r in res.ranks)
            marker = LEAK_MARKERS.get(path.stem)
            leaked = bool(marker and marker in out)
            if path.stem == "detached_child":
                left = subprocess.run(["pgrep", "-f", "commbench-detached-marker"], capture_output=True, text=True)
                leaked = leaked or bool(left.stdout.strip())
            ok = reward == 0.0 and not leaked if path.stem != "detached_child" else not leaked
            rows.append((f"{path.parent.name}/{path.name}", task.id, res.verdict.value, reward, leaked,
                         res.summary[:90].replace("\n", " "), time.monotonic() - t0))
            print(f"{rows[-1][0]:<40} {task.id:<28} {res.verdict.value:<14} reward {reward:.2f} "
                  f"leak {leaked} ({rows[-1][6]:.1f} s): {rows[-1][5]}", flush=True)
            if not ok:
                bad.append(rows[-1][0])
        client.close()
    if a.out:
        lines = [f"# GPU attack checks ({a.mode}, world {a.world})", "",
                 "| attack | task | verdict | reward | leaked | summary |", "|---|---|---|---|---|---|"]
        lines += [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2f} | {r[4]} | {r[5]} |" for r in rows]
        Path(a.out).write_text("\n".join(lines) + "\n")
    print("\nevery attack scored zero" if not bad else f"\nGOT THROUGH: {', '.join(bad)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
