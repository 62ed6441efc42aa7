"""Launches that escape the harness's stream, judged on GPUs: each file in tests/attacks/cuda/ (CUDA sources for
`cuda` tasks, Python for torch tasks) next to its task's reference, in `cuda` mode at world 2 (needs 2 GPUs).
Run on a GPU machine.

A file marked `EXPECT: timed` must pass and take at least 0.8x the reference's time at every size (its work is
inside the clock). One marked `EXPECT: open` documents a gap the judge does not close yet: its figures are
printed, not asserted. Exit status 1 if a `timed` file fails its check.

    python benchmarks/gpu_stream_checks.py [--world 2] [--trace FILE]

--trace appends the device host's per-call timing trace (COMMBENCH_TIMING_TRACE) to FILE.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from commbench_env.cards import load_task
from commbench_env.judge.host.client import JudgeClient
from commbench_env.sandbox import load_profile, open_sandbox

ATTACKS = Path(__file__).resolve().parents[1] / "tests" / "attacks" / "cuda"
TIMED_FLOOR = 0.8  # a timed launch may not read faster than this fraction of the reference's time


def header(path: Path, key: str) -> str:
    """A `// KEY: value` (CUDA) or `# KEY: value` (Python) line of an attack file."""
    return next(ln.split(":", 1)[1].strip() for ln in path.read_text().splitlines()
                if ln.startswith((f"// {key}:", f"# {key}:")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--trace", help="append the device host's timing trace (one JSON line per timed call) here")
    a = ap.parse_args()
    failed = []
    profile = load_profile("local-gpu")
    if a.trace:
        profile = profile.with_env({"COMMBENCH_TIMING_TRACE": a.trace})
    with open_sandbox(profile) as sb:
        client = JudgeClient(sb)
        refs = {}
        for path in sorted([*ATTACKS.glob("*.cu"), *ATTACKS.glob("*.py")]):  # cuda tasks, torch tasks
            task = load_task(header(path, "TASK"))
            expect = header(path, "EXPECT")
            if task.id not in refs:
                refs[task.id] = client.evaluate(task, {task.card.entry.file: task.reference_source()}, "benchmark",
                                                a.world, device_mode="cuda")
            ref = refs[task.id]
            res = client.evaluate(task, {task.card.entry.file: path.read_text()}, "benchmark", a.world,
                                  device_mode="cuda")
            print(f"{path.name} ({task.id}, expect {expect}): verdict {res.verdict.value}")
            ok = res.verdict.value == "pass"
            for s, r in zip(res.benchmark, ref.benchmark):
                ratio = s.time_us_median / r.time_us_median if r.time_us_median else 0.0
                ok = ok and ratio >= TIMED_FLOOR
                why = f", {s.mismatch.detail[:100]}" if s.mismatch else ""
                print(f"  {s.size_bytes:>10} B: {s.time_us_median:8.1f} us against the reference's "
                      f"{r.time_us_median:8.1f} us ({ratio:.2f}x){why}")
            if expect == "timed" and not ok:
                failed.append(path.name)
        client.close()
    print("\nall 'timed' launches were timed" if not failed else f"\nNOT timed: {', '.join(failed)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
