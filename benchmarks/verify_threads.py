"""How long the coordinator takes to verify one benchmark size's timed iterations, one thread against a pool, and
for sampled outputs, with the op's full expected outputs against only the sampled positions (`expected_samples`);
and how long the device host (`cuda` tasks) takes to make the inputs of all of that size's calls, likewise.

Each timed iteration is verified against its own regenerated inputs, so with nccl-tests' 20 timed calls per size
verification grew to the largest part of a GPU evaluation (5.4 of 13.2 s for allreduce_ring at world 2). The
coordinator checks iterations on a thread pool (`VERIFY_THREADS`); this prints both, side by side, for correct
outputs of a real task at a GPU-sized case (every iteration is checked in full, the worst case).

The device host makes every call's inputs on the CPU (judge/staging.py: a batch at a time on a pool).

    python benchmarks/verify_threads.py [--task collective/allreduce_ring] [--size 16777216] [--iters 20]
"""

from __future__ import annotations

import argparse
import os
import secrets
import time

import torch

from commbench_env.cards import load_task
from commbench_env.golden.base import GoldenOp
from commbench_env.judge.coordinator import evaluation
from commbench_env.judge import staging
from commbench_env.judge.host.request import JudgeRequest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="collective/allreduce_ring")
    ap.add_argument("--size", type=int, default=16 << 20, help="bytes (the nccl-tests size)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--world", type=int, default=2)
    a = ap.parse_args()
    task = load_task(a.task)
    req = JudgeRequest(task=task.judge_spec(), mode="benchmark", world_size=a.world,
                       secret=secrets.token_bytes(32).hex(), workdir="/nonexistent")
    ev = evaluation.Evaluation(req)
    case = ev.op.size_case(task.card.performance, a.size, a.world)
    seeds = [[ev.seed("bench", a.size, it, r) for it in range(a.iters)] for r in range(a.world)]
    samples, sampled = [], []  # correct outputs, the golden results themselves: in full, and as a rank samples them
    for it in range(a.iters):
        inputs = [ev.op.make_inputs(case, r, a.world, seeds[r][it]) for r in range(a.world)]
        for r, outs in enumerate(ev.op.expected(case, a.world, inputs)):
            samples.append((it, r, outs))
        for r, outs in enumerate(ev.sampled_expectation(case, a.size, it, inputs)):
            sampled.append((it, r, {**{n: v for n, (_, _, v) in outs.items()},
                                    **{n + "#numel": torch.tensor([k]) for n, (k, _, _) in outs.items()}}))
    own_samples = type(ev.op).expected_samples is not GoldenOp.expected_samples
    print(f"{a.task}, world {a.world}, {a.size} bytes, {a.iters} timed iterations, {os.cpu_count()} cores")
    figures = {}
    for threads in (1, evaluation.VERIFY_THREADS):
        evaluation.VERIFY_THREADS = threads
        t0 = time.perf_counter()
        mismatch = ev.verify_samples(case, a.size, seeds, samples, True)
        figures[threads] = time.perf_counter() - t0
        assert mismatch is None, mismatch
        print(f"  {threads} thread(s): {figures[threads]:.2f} s")
    one, pool = figures[1], figures[max(figures)]
    print(f"  ratio pool / one thread: {pool / one:.2f}")

    # what a benchmark does: the ranks send samples of each output; the pool checks them
    print(f"sampled verification ({evaluation.VERIFY_THREADS} threads): the op's outputs in full, then indexed, "
          f"against computed at the samples only{'' if own_samples else ' (this op has no sampled form)'}")
    timed = {}
    for label, hook in (("in full", GoldenOp.expected_samples), ("at the samples", type(ev.op).expected_samples)):
        type(ev.op).expected_samples = hook
        t0 = time.perf_counter()
        mismatch = ev.verify_samples(case, a.size, seeds, sampled, False)
        timed[label] = time.perf_counter() - t0
        assert mismatch is None, mismatch
        print(f"  {label}: {timed[label]:.2f} s")
    print(f"  ratio at the samples / in full: {timed['at the samples'] / timed['in full']:.2f}")

    calls = a.iters + task.card.performance.gpu_warmup
    print(f"device host input staging, {calls} calls (warm-up included)")

    def make(it: int) -> list:
        return [ev.op.make_inputs(case, r, a.world, seeds[r][it % a.iters]) for r in range(a.world)]

    staged = {}
    for threads in (1, staging.STAGING_THREADS):
        t0 = time.perf_counter()
        for _ in staging.in_batches(make, range(calls), threads):
            pass
        staged[threads] = time.perf_counter() - t0
        print(f"  {threads} thread(s): {staged[threads]:.2f} s")
    print(f"  ratio pool / one thread: {staged[staging.STAGING_THREADS] / staged[1]:.2f}")


if __name__ == "__main__":
    main()
