"""Judge candidate variants of task references side by side with the reference, on this machine's GPU.

Used to tune a reference before adopting it: every variant and the task's own reference are judged in `full`
mode in one sandbox and one run, so their figures share the machine's state. Each line gives the verdict, the
wall time and, per benchmark size, (KiB, median us, the task's metric, % of the roofline the judge measured).

    python benchmarks/reference_variants.py [--mode cuda-shared] [--worlds 2,4] [--out DIR] \
        TASK=FILE[,FILE...] [TASK=FILE...]

A variant that fails prints its feedback, so a broken kernel shows why.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path

from commbench_env.cards import load_task
from commbench_env.errors import CommBenchError
from commbench_env.judge.host.client import JudgeClient
from commbench_env.sandbox import GPU_PROFILE_FOR_MODE, load_profile, open_sandbox



def sizes_text(res, metric: str) -> str:
    """Per benchmark size: KiB, median us, the metric, % of the judge's roofline."""
    rows = []
    for b in sorted(res.benchmark, key=lambda b: b.size_bytes):
        value = {"busbw": b.busbw_gbps, "algbw": b.algbw_gbps, "tflops": b.tflops}.get(metric, b.time_us)
        pct = f"{b.roofline_pct:.0f}%" if b.roofline_pct is not None else "-"
        rows.append(f"({b.size_bytes >> 10} KiB, {b.time_us:.1f} us, {value:.1f}, {pct})")
    return " ".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", help="TASK=FILE[,FILE...]")
    ap.add_argument("--mode", default="cuda-shared", choices=sorted(GPU_PROFILE_FOR_MODE))
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per evaluation")
    ap.add_argument("--out", help="also write the lines to DIR/reference_variants-<date>.md")
    a = ap.parse_args()
    plan = []
    for spec in a.variants:
        task_id, _, files = spec.partition("=")
        task = load_task(task_id)
        plan.append((task, [None] + [Path(f) for f in files.split(",") if f]))
    lines = [f"# Reference variants, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, mode {a.mode}", ""]
    with open_sandbox(load_profile(GPU_PROFILE_FOR_MODE[a.mode])) as sb:
        client = JudgeClient(sb)
        for task, files in plan:
            for path in files:
                source = task.reference_source() if path is None else path.read_text()
                for world in (int(w) for w in a.worlds.split(",")):
                    if world not in task.card.world.sizes:
                        continue
                    t0 = time.monotonic()
                    try:
                        res = client.evaluate(task, {task.card.entry.file: source}, "full", world,
                                              device_mode=a.mode, timeout_s=a.timeout)
                    except CommBenchError as exc:
                        line = f"{task.id} {path or 'reference'} w{world}: infra_error {exc}"
                        res = None
                    else:
                        line = (f"{task.id} {path.name if path else 'reference'} w{world}: {res.verdict.value} "
                                f"{time.monotonic() - t0:.0f}s {sizes_text(res, task.card.performance.metric)}")
                    print(line, flush=True)
                    lines.append(f"- {line}")
                    if res is not None and res.verdict.value != "pass":
                        print(res.feedback(2000), flush=True)
        client.close()
    if a.out:
        out = Path(a.out) / f"reference_variants-{dt.date.today().isoformat()}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")
        print(f"written {out}")


if __name__ == "__main__":
    main()
