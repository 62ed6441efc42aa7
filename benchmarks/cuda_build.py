"""Build cost of a cuda candidate: a fresh judge build and a cache hit, against a bare nvcc of the same file.

Targets: fresh build <= 1.5x bare nvcc; an unchanged source is a cache hit in well under 0.1 s.

    python benchmarks/cuda_build.py [--task p2p/ipc_pull_copy] [--runs 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from commbench_env.cards import load_task
from commbench_env.judge.coordinator.cuda_build import HEADER_DIR, build, nvcc_version


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="p2p/ipc_pull_copy")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if not shutil.which("nvcc"):
        raise SystemExit("nvcc is not on PATH")
    task = load_task(a.task)
    spec = task.card.cuda
    nvcc_version()  # asked once per judge server, as in the sandbox
    bare, fresh, hit = [], [], []
    for i in range(a.runs):
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "solution.cu"
            src.write_text(task.reference_source() + f"\n// run {i}\n")  # a new hash each run: no cache hit
            t0 = time.perf_counter()
            subprocess.run(["nvcc", "-O3", f"-arch={spec.arch}", "-shared", "-Xcompiler", "-fPIC", f"-I{HEADER_DIR}",
                            "-o", str(Path(d) / "bare.so"), str(src)], check=True, capture_output=True)
            bare.append(time.perf_counter() - t0)
            cache = Path(d) / "cache"
            t0 = time.perf_counter()
            r = build(src, card_arch=spec.arch, links=spec.links, extra_flags=spec.nvcc_flags,
                      functions=task.card.entry.functions, cache_dir=cache)
            fresh.append(time.perf_counter() - t0)
            assert r.ok and not r.cache_hit, r.log
            t0 = time.perf_counter()
            r = build(src, card_arch=spec.arch, links=spec.links, extra_flags=spec.nvcc_flags,
                      functions=task.card.entry.functions, cache_dir=cache)
            hit.append(time.perf_counter() - t0)
            assert r.cache_hit
    b, f, h = statistics.median(bare), statistics.median(fresh), statistics.median(hit)
    print(f"{a.task}: bare nvcc {b:.3f} s, judge build {f:.3f} s (ratio {f / b:.2f}, target <= 1.5), "
          f"cache hit {h * 1000:.1f} ms (target < 100 ms); medians of {a.runs}")


if __name__ == "__main__":
    main()
