"""On a GPU: does the judge catch broken kernels, name hung ranks, and give useful profiler and sanitizer text?

Runs the faulty CUDA kernels of tests/faulty_cuda.py (each a reference with one planted bug) and the reference of
p2p/ipc_pull_copy
through the judge, checks each verdict against what it should be, prints the agent's feedback for each, and
writes a markdown report. Needs a GPU; `cuda-shared` works on one.

    python benchmarks/gpu_feedback_demo.py [--mode cuda-shared] [--world 4] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import torch

from commbench_env.cards import load_task
from commbench_env.judge.host.client import JudgeClient
from commbench_env.judge.host.result import JudgeResult, Verdict
from commbench_env.sandbox import GPU_PROFILE_FOR_MODE, open_sandbox

# the broken kernels live beside the tests that build them
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.faulty_cuda import FAULTS



def _expect_wrong(res: JudgeResult) -> bool:
    return res.verdict == Verdict.wrong_answer


def _expect_hang(res: JudgeResult) -> bool:
    return res.verdict == Verdict.timeout and "rank(s) 0" in res.summary


def _expect_profile(res: JudgeResult) -> bool:
    # each rank's own kernels: the device host tells them apart by stream (cuda-shared) or GPU (cuda)
    return (res.verdict == Verdict.passed and bool(res.profile) and res.ncu is not None
            and all(p.rows and p.rows_of_own_kernels for p in res.profile))


def _expect_clean(res: JudgeResult) -> bool:
    return res.verdict == Verdict.passed and all(s.errors == 0 for s in res.sanitizer)


def _expect_memcheck(res: JudgeResult) -> bool:
    return any(s.tool == "memcheck" and s.errors for s in res.sanitizer)


# (what, task, fault name or None for the reference, mode, timeout, check)
CASES = [
    ("reference profile: kernel table + ncu", "p2p/ipc_pull_copy", None, "profile", 120, _expect_profile),
    ("reference sanitize: no findings", "p2p/ipc_pull_copy", None, "sanitize", 240, _expect_clean),
    ("off-by-one peer index -> wrong answer", "p2p/ipc_pull_copy", "off_by_one_peer", "check", 60, _expect_wrong),
    ("64 bytes out of bounds -> memcheck errors", "p2p/ipc_pull_copy", "out_of_bounds", "sanitize", 240,
     _expect_memcheck),
    ("rank 0 waits forever -> timeout naming rank 0", "p2p/ipc_pull_copy", "deadlock", "check", 30, _expect_hang),
    ("two-shot without its wait (race) -> wrong answer", "collective/allreduce_twoshot", "no_wait_race", "full",
     120, _expect_wrong),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="cuda-shared", choices=sorted(GPU_PROFILE_FOR_MODE))
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run this on a GPU machine")
    rows, details = [], []
    with open_sandbox(GPU_PROFILE_FOR_MODE[a.mode]) as sb:
        client = JudgeClient(sb)
        for what, task_id, sub, mode, timeout, check in CASES:
            task = load_task(task_id)
            source = task.reference_source() if sub is None else FAULTS[sub].source()
            res = client.evaluate(task, {task.card.entry.file: source}, mode, a.world, device_mode=a.mode,
                                  timeout_s=timeout)
            ok = check(res)
            rows.append((what, res.verdict.value, res.summary.splitlines()[0][:90] if res.summary else "",
                         "as expected" if ok else "NOT as expected", f"{res.timings.total_s:.1f}"))
            print(" | ".join(rows[-1]), flush=True)
            details.append(f"### {what}\n\n```\n{res.feedback(4000)}\n```\n")
        client.close()
    md = [f"# GPU feedback demo, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}",
          (f"- {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; mode {a.mode}, world {a.world}; "
           f"torch {torch.__version__}"), "",
          "| case | verdict | summary | check | seconds |", "|---|---|---|---|---|"]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md += ["", "## Feedback the agent sees", "", *details]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu_feedback_demo-{dt.date.today().isoformat()}-{a.mode}-w{a.world}.md"
    path.write_text("\n".join(md) + "\n")
    print(f"written {path}; {sum(r[3] != 'as expected' for r in rows)} case(s) not as expected")


if __name__ == "__main__":
    main()
