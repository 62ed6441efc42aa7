"""The coordinator of one evaluation: the stages, the seeds, verification and figures, all in a process that
never runs candidate code.

Stages: static_check (or the CUDA build) -> start the rank group -> check -> benchmark -> profile -> stop. The
candidate processes are reached only through a `RankGroup` (rank_group.py): torch ranks or the CUDA device host.
"""

from __future__ import annotations

import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from ... import __version__
from ...cards import CaseSpec, PerformanceSpec, TaskCard, bus_share_of_copy, busbw_factor
from ...golden import get_op
from ...golden.base import GoldenOp
from ...golden.compare import compare_tensor
from ..host.request import JudgeRequest
from ..host.result import (CaseResult, CompileReport, JudgeResult, Mismatch, ModelledTime, Roofline, SizeResult,
                           Timings, Verdict, Violation)
from ..protocol import derive_seed, sample_positions, sample_together
from ..rules import expand_forbidden
from ..staging import usable_cores
from .comm_model import ModelledCall
from .links import RankFailure
from .rank_group import RankGroup
from .static_check import check_source
from .timing import implausible_timing
from .torch_ranks import TorchRanks

if TYPE_CHECKING:
    from .spawner import Spawner

VERIFY_THREADS = 8  # timed iterations checked at once (each regenerates its inputs; torch releases the GIL)


class Evaluation:
    def __init__(self, req: JudgeRequest, spawner: "Spawner | None" = None):
        self.req = req
        self.spawner = spawner
        self.library = ""  # a cuda candidate's built library
        self.card = TaskCard.model_validate(req.task["card"])
        self.op: GoldenOp = get_op(self.card.semantics.op)
        self.secret = bytes.fromhex(req.secret)
        self.workdir = Path(req.workdir)
        self.world = req.world_size
        self.timeout_s = req.timeout_s or self.card.limits.timeout_s
        self.deadline = time.monotonic() + self.timeout_s
        self.timings = Timings()
        self.t_start = time.monotonic()
        self.result = JudgeResult(task_id=self.card.id, task_hash=req.task.get("task_hash", ""), mode=req.mode,
                                  world_size=self.world, device_mode=req.device_mode, verdict=Verdict.passed,
                                  judge_version=__version__, source_hash=req.source_hash,
                                  metric=self.card.performance.metric,
                                  roofline_bound=self.card.performance.bound_at(self.world),
                                  roofline_reason=self.card.performance.roofline_reason)
        # the processes that will run candidate code, in the shape the task's language needs (none started yet)
        self.group: RankGroup = self._rank_group()

    def _rank_group(self) -> RankGroup:
        if self.card.language.value == "cuda":
            from .device_host_ranks import DeviceHostRanks

            return DeviceHostRanks(self)
        return TorchRanks(self)

    # ---- stage 1: static -------------------------------------------------------------------------------
    def static_check(self) -> bool:
        t0 = time.monotonic()
        entry = self.card.entry
        path = self.workdir / "candidate" / entry.file
        if not path.is_file():
            self.result.compile = CompileReport(ok=False, log=f"no file {entry.file!r} was submitted")
            self.result.verdict = Verdict.compile_error
            self.result.summary = f"{entry.file} is missing from the submission"
            return False
        if self.card.language.value == "cuda":
            return self.build_cuda(path, t0)
        source = path.read_text(errors="replace")
        forbidden, attrs = expand_forbidden(self.card.rules.forbidden_apis)
        rep = check_source(source, entry.file, forbidden, attrs, self.card.rules.extra_imports, entry.functions)
        violations = [Violation(**v) for v in rep.violations]
        if not self.req.static_check and not rep.syntax_error:
            violations, rep.ok = [], True
        self.result.compile = CompileReport(ok=rep.ok, log=rep.log, violations=violations)
        self.timings.compile_s = time.monotonic() - t0
        if rep.ok:
            return True
        forbidden_hits = [v for v in violations if v.rule not in ("import_error",)]
        if forbidden_hits:
            self.result.verdict = Verdict.forbidden
            self.result.violations = forbidden_hits
            self.result.summary = f"{len(forbidden_hits)} rule violation(s); first: line {forbidden_hits[0].line}: {forbidden_hits[0].detail}"
        else:
            self.result.verdict = Verdict.compile_error
            self.result.summary = (rep.log.splitlines() or ["compile error"])[-1]
        return False

    def build_cuda(self, path: Path, t0: float) -> bool:
        from .cuda_build import build

        spec = self.card.cuda
        assert spec is not None
        cache = Path(self.req.cache_dir) if self.req.cache_dir else self.workdir.parent / "cuda-cache"
        b = build(path, card_arch=spec.arch, links=spec.links, extra_flags=spec.nvcc_flags,
                  functions=self.card.entry.functions, cache_dir=cache, allow_symbols=spec.allow_symbols)
        self.library = b.library
        log = "\n".join(x for x in (b.log, "\n".join(b.ptxas)) if x)
        violations = [Violation(**v) for v in b.violations] if self.req.static_check else []
        self.result.compile = CompileReport(ok=b.ok and not violations, log=log, violations=violations,
                                            cache_hit=b.cache_hit, seconds=b.seconds)
        self.timings.compile_s = time.monotonic() - t0
        if not b.ok:
            self.result.verdict = Verdict.compile_error
            errors = [ln for ln in b.log.splitlines() if "error" in ln]
            self.result.summary = (errors or b.log.splitlines() or ["compile error"])[0][:300]
            return False
        if violations:
            self.result.verdict = Verdict.forbidden
            self.result.violations = violations
            self.result.summary = f"{len(violations)} rule violation(s); first: {violations[0].detail}"
            return False
        return True

    def accept_setup(self, msgs: dict[int, tuple[dict, bytes]]) -> None:
        """The isolation report (the weakest rank's) and the roofline, from the pre-candidate set-up messages."""
        reports = [m[0].get("isolation") or {} for _, m in sorted(msgs.items())]
        iso = dict(reports[0]) if reports else {}
        for rep in reports[1:]:
            for k, v in rep.items():
                if isinstance(v, bool) and not v:
                    iso[k] = False
                elif k == "landlock_abi":
                    iso[k] = min(int(iso.get(k, 0)), int(v))
        self.result.isolation = iso
        head = msgs[min(msgs)][0] if msgs else {}
        if isinstance(head.get("device"), dict):
            self.result.hardware["rank_device"] = head["device"]
        if head.get("roofline"):
            try:
                self.result.roofline = Roofline.model_validate(head["roofline"])
            except ValueError as exc:
                raise RankFailure(Verdict.runtime_error, f"rank 0 sent a malformed roofline: {exc}") from None

    # ---- stage 3: correctness ------------------------------------------------------------------------
    def seed(self, *parts: object) -> int:
        return derive_seed(self.secret, *parts)

    def tolerance(self, case: CaseSpec) -> tuple[float, float]:
        tol = self.card.tolerance_for(case.dtype)
        return tol.rtol, tol.atol

    def inputs_changed(self, case: CaseSpec, inputs: list[dict], shown: list[dict], detail: str = "",
                       sample_seed: int | None = None) -> Mismatch | None:
        """Whether a rank changed a read-only input: compared here, with the inputs regenerated from their seeds,
        to what the rank handed back after the call (whole, or sampled by `sample_together` with `sample_seed`,
        drawn after the call)."""
        if not self.card.rules.inputs_read_only:
            return None
        for r in range(self.world):
            mine = self.op.candidate_inputs(inputs[r])
            want = mine if sample_seed is None else sample_together(mine, sample_seed)
            for name in sorted(want):
                got = shown[r].get(name)
                if got is None or not _same(want[name].reshape(-1), got.reshape(-1)):
                    what = name if sample_seed is None else f"{name.split('#')[0]} inputs"
                    return Mismatch(case=case.name, rank=r, output=what, reason="input_mutated", hidden=not case.visible,
                                    detail=f"rank {r} modified its input {what!r}; inputs are read-only{detail}")
        return None

    def run_case(self, case: CaseSpec) -> CaseResult:
        t_in = time.monotonic()
        seeds = [self.seed("case", case.name, r) for r in range(self.world)]
        inputs = [self.op.make_inputs(case, r, self.world, seeds[r]) for r in range(self.world)]  # made once here
        t0 = time.monotonic()
        with self.group.links.per_case(self.card.limits.case_limit_s):
            handed = self.group.check_call(case, seeds, inputs)
        t1 = time.monotonic()
        changed = self.inputs_changed(case, inputs, [h[1] for h in handed])
        mm = None if changed else self.op.verify(case, self.world, inputs, [h[0] for h in handed], self.tolerance(case))
        self.timings.verify_s += time.monotonic() - t1 + (t0 - t_in)
        mismatch = changed or (Mismatch(hidden=not case.visible, **mm) if mm else None)
        return CaseResult(name=case.name, visible=case.visible, passed=mismatch is None,
                          seconds=t1 - t0, mismatch=mismatch)

    def check(self) -> None:
        t0 = time.monotonic()
        cases = [c for c in self.card.cases if self.op.supports_world(self.world, c)]
        if not cases:
            raise RankFailure(Verdict.infra_error, f"no case of {self.card.id} applies at world size {self.world}")
        cases.sort(key=lambda c: not c.visible)
        for case in cases:
            self.result.cases.append(self.run_case(case))
        self.timings.run_s += time.monotonic() - t0 - self.timings.verify_s

    # ---- stage 4: benchmark --------------------------------------------------------------------------
    def benchmark(self) -> None:
        perf = self.card.performance.for_device(self.req.device_mode)
        t0 = time.monotonic()
        verify_before = self.timings.verify_s
        for size in perf.sizes_for(self.req.device_mode):
            self.result.benchmark.append(self.bench_size(perf, size))
        self.timings.run_s += time.monotonic() - t0 - (self.timings.verify_s - verify_before)

    def bench_size(self, perf: PerformanceSpec, size: int) -> SizeResult:
        case = self.op.size_case(perf, size, self.world)
        seeds = [[self.seed("bench", size, it, r) for it in range(perf.warmup + perf.iters)] for r in range(self.world)]
        calls = self.group.bench_calls(case, size, perf, seeds)
        t1 = time.monotonic()
        mismatch = self.verify_samples(case, size, seeds, calls.samples, calls.full)
        self.timings.verify_s += time.monotonic() - t1
        return self.size_result(case, size, perf, calls.times, mismatch).model_copy(
            update={"extended_calls": calls.extended, "clock_bounded": calls.bounded,
                    "modelled": self.modelled_time(case, calls.modelled)})

    def modelled_time(self, case: CaseSpec, calls: list[ModelledCall]) -> ModelledTime | None:
        """The timed calls on the link model (CPU): the median call, nccl-tests' bandwidth formulas on it."""
        if not calls:
            return None
        model = self.req.link_model
        times = [c.time_us for c in calls]
        mid = sorted(calls, key=lambda c: c.time_us)[len(calls) // 2]
        t_us = mid.time_us
        nbytes = self.op.metric_bytes(case, self.world)
        algbw = nbytes / (t_us * 1e-6) / 1e9 if t_us > 0 else 0.0
        busbw = algbw * busbw_factor(self.op.nccl_op, self.world)
        metric = self.card.performance.metric
        shown = algbw if metric == "algbw" else busbw
        pct = 100 * shown / model.port_gbps if metric in ("busbw", "algbw") and shown > 0 else None
        return ModelledTime(link_model=model.name, port_gbps=model.port_gbps, alpha_us=model.alpha_us,
                            overhead_us=model.overhead_us, time_us=t_us,
                            algbw_gbps=algbw, busbw_gbps=busbw, roofline_pct=pct, messages=mid.messages,
                            bytes_moved=mid.bytes_moved, collectives=mid.collectives,
                            max_rank_bytes_out=max(mid.bytes_out, default=0),
                            max_rank_bytes_in=max(mid.bytes_in, default=0), spread_us=max(times) - min(times))

    def sample_ask(self, size: int, it: int) -> dict[str, int]:
        """The seeds of the positions sampled after timed call `it`: of its outputs, and of its read-only inputs."""
        return {"sample_seed": self.seed("sample", size, it), "input_seed": self.seed("sample-in", size, it)}

    def size_result(self, case: CaseSpec, size: int, perf, times: list[list[float]],
                    mismatch: Mismatch | None) -> SizeResult:
        """nccl-tests statistics from times[rank][iteration] in microseconds."""
        per_rank_mean = [sum(t) / len(t) for t in times]
        per_iter_max = [max(times[r][i] for r in range(self.world)) for i in range(perf.iters)]
        t_us = max(per_rank_mean)  # nccl-tests: average over iterations, max over ranks
        nbytes = self.op.metric_bytes(case, self.world)
        algbw = nbytes / (t_us * 1e-6) / 1e9 if t_us > 0 else 0.0
        flops = self.op.flops(case, self.world)
        busbw = algbw * busbw_factor(self.op.nccl_op, self.world)
        roof = self.result.roofline
        shown = algbw if self.card.performance.metric == "algbw" else busbw
        roof_gbps = roof.per_rank_gbps if roof and roof.per_rank_gbps > 0 else None
        if roof_gbps and roof.emulated and self.card.performance.metric == "busbw":
            roof_gbps *= bus_share_of_copy(self.op.nccl_op, self.world)
        if roof_gbps:
            roof_gbps *= self.result.roofline_bound
        pct = 100 * shown / roof_gbps if roof_gbps and shown > 0 else None
        if mismatch is None and self.card.performance.metric in ("busbw", "algbw"):
            why = implausible_timing(pct, size, roof.name if roof else "")
            if why:
                fastest = min(range(self.world), key=lambda r: per_rank_mean[r])
                mismatch = Mismatch(case=case.name, rank=fastest, output="", reason="timing", detail=why)
        return SizeResult(size_bytes=size, dtype=case.dtype, count=int(case.shape[0]) if case.shape else 0,
                          iters=perf.iters, warmup=perf.warmup, time_us=t_us,
                          time_us_median=statistics.median(per_iter_max), time_us_min=min(per_iter_max),
                          time_us_scored=(statistics.median(per_iter_max) if self.scores_median()
                                          else statistics.fmean(per_iter_max)),
                          per_rank_mean_us=per_rank_mean, algbw_gbps=algbw,
                          busbw_gbps=busbw, roofline_gbps=roof_gbps, roofline_pct=pct,
                          tflops=flops / (t_us * 1e-6) / 1e12 if flops and t_us > 0 else 0.0,
                          verified=mismatch is None, mismatch=mismatch)

    def verify_samples(self, case: CaseSpec, size: int, seeds, samples, full: bool) -> Mismatch | None:
        """Check every timed iteration's outputs (or samples of them); the first mismatch by iteration, or None.

        Iterations are independent (each has its own inputs to regenerate), so they are checked on a thread pool:
        with nccl-tests' 20 timed calls, regenerating inputs dominated a GPU evaluation's wall time."""
        by_iter: dict[int, dict[int, dict]] = {}
        for it, r, outs in samples:
            by_iter.setdefault(it, {})[r] = outs
        items = sorted(by_iter.items())
        workers = max(1, min(len(items), VERIFY_THREADS, usable_cores()))
        with ThreadPoolExecutor(workers, thread_name_prefix="verify") as pool:
            found = list(pool.map(lambda item: self.verify_iteration(case, size, seeds, *item, full), items))
        return next((m for m in found if m is not None), None)

    def verify_iteration(self, case: CaseSpec, size: int, seeds, it: int, handed: dict[int, tuple[dict, dict]],
                         full: bool) -> Mismatch | None:
        tol = self.tolerance(case)
        inputs = [self.op.make_inputs(case, r, self.world, seeds[r][it]) for r in range(self.world)]
        per_rank = {r: handed[r][0] for r in handed}
        shown = [handed[r][1] for r in range(self.world)]
        changed = self.inputs_changed(case, inputs, shown, f" (timed iteration {it})",
                                      self.sample_ask(size, it)["input_seed"])
        if changed:
            return changed
        if full:
            mm = self.op.verify(case, self.world, inputs, [per_rank[r] for r in range(self.world)], tol)
            if mm:
                mm["detail"] = (mm.get("detail", "") + f" (timed iteration {it})").strip()
                return Mismatch(**mm)
            return None
        for r, outputs in enumerate(self.sampled_expectation(case, size, it, inputs)):
            for name, (numel, idx, exp) in sorted(outputs.items()):
                got = per_rank[r].get(name)
                got_numel = per_rank[r].get(name + "#numel")
                if got is None or got_numel is None or int(got_numel[0]) != numel:
                    return Mismatch(case=case.name, rank=r, output=name, reason="shape",
                                    detail=f"timed iteration {it}: output {name!r} has the wrong size")
                if numel == 0:
                    continue
                m = compare_tensor(exp, got, tol)
                if m:
                    pos = int(idx[m["index"][0]]) if m.get("index") else 0
                    m["index"] = [pos]
                    m.pop("wrong_count", None), m.pop("total_count", None)
                    return Mismatch(case=case.name, rank=r, output=name,
                                    detail=f"timed iteration {it} (sampled check)", **m)
        return None

    def sampled_expectation(self, case: CaseSpec, size: int, it: int, inputs: list[dict]) -> list[dict]:
        """Per rank: output name -> (numel, the flat positions the rank sampled, the expected values there).

        Positions are drawn as the rank drew them: one generator per rank from the iteration's sample seed, outputs
        in sorted name order, nothing drawn for an empty output. Ops that can compute their outputs at a few
        positions (`GoldenOp.expected_samples`) skip the full expected outputs, which cost more than making the
        inputs again (0.2 s per 64 MiB all-reduce iteration, 2 s for the fused RMSNorm)."""
        import torch

        gens = [torch.Generator().manual_seed(self.seed("sample", size, it)) for _ in range(self.world)]
        drawn: list[dict] = [{} for _ in range(self.world)]

        def pick(rank: int, name: str, numel: int):
            idx = sample_positions(numel, gens[rank])
            drawn[rank][name] = (numel, idx)
            return idx

        values = self.op.expected_samples(case, self.world, inputs, pick)
        if values is None:
            values = [{name: exp.reshape(-1)[pick(r, name, exp.numel())] for name, exp in sorted(outs.items())}
                      for r, outs in enumerate(self.op.expected(case, self.world, inputs))]
        return [{name: (*drawn[r][name], v) for name, v in values[r].items()} for r in range(self.world)]

    def scores_median(self) -> bool:
        """Whether timed calls were released one at a time (then the median iteration is safe to score: no call
        could see a later call's inputs) rather than run back-to-back (then the mean is scored)."""
        return self.group.calls_released_singly

    # ---- stage 5: profile ----------------------------------------------------------------------------
    def profile(self) -> None:
        case = max(self.card.visible_cases(), key=lambda c: self.op.metric_bytes(c, self.world))
        try:
            profiles, ncu = self.group.profile(case)
        except (KeyError, TypeError, ValueError, IndexError) as exc:  # a profile message the protocol does not allow
            raise RankFailure.protocol("a rank", f"malformed profile ({type(exc).__name__}: {exc})", case.name) from None
        self.result.profile.extend(profiles)
        if ncu is not None:
            self.result.ncu = ncu

    # ---- the whole evaluation ---------------------------------------------------------------------------
    def run(self) -> JudgeResult:
        mode = self.req.mode
        try:
            if not self.static_check():
                return self.finish()
            if mode == "compile":
                self.result.verdict = Verdict.compiled
                self.result.summary = "compiled: syntax, imports and rules are fine (nothing was run)"
                return self.finish()
            if self.req.device_mode not in [m.value for m in self.card.world.device_modes]:
                self.result.verdict = Verdict.infra_error
                self.result.summary = (f"{self.card.id} does not run in device mode {self.req.device_mode!r}; "
                                       f"it declares {[m.value for m in self.card.world.device_modes]}")
                return self.finish()
            if self.world not in self.card.world.sizes:
                self.result.verdict = Verdict.infra_error
                self.result.summary = f"{self.card.id} runs at world sizes {self.card.world.sizes}, not {self.world}"
                return self.finish()
            self.run_mode()
        except RankFailure as f:
            self.result.verdict = f.verdict
            self.result.summary = f.summary
            if f.case:
                names = {c.name for c in self.result.cases}
                if f.case not in names:
                    case = next((c for c in self.card.cases if c.name == f.case), None)
                    self.result.cases.append(CaseResult(name=f.case, visible=case.visible if case else False,
                                                        passed=False, error=f.summary))
        finally:
            if self.group.links:
                ranks, violations = self.group.stop(self.result.verdict == Verdict.passed, self.req.max_output_chars)
                self.result.ranks.extend(ranks)
                self.result.violations.extend(v for v in violations if v not in self.result.violations)
        return self.finish()

    def run_mode(self) -> None:
        """Start the ranks and run the stages the mode asks for."""
        mode = self.req.mode
        if mode == "sanitize":
            if self.card.language.value != "cuda":
                raise RankFailure(Verdict.infra_error, "sanitize runs compute-sanitizer on cuda tasks; this task is "
                                                       f"written in {self.card.language.value}")
            from .cuda_tools import sanitize

            self.result.sanitizer = sanitize(self)
            bad = [s for s in self.result.sanitizer if s.errors]
            self.result.verdict = Verdict.runtime_error if bad else self.result.verdict
            self.result.summary = ("; ".join(f"{s.tool}: {s.errors} error(s)" for s in bad) if bad else "; ".join(
                f"{s.tool}: {s.errors if s.errors is not None else '?'} error(s), {s.status}"
                for s in self.result.sanitizer))
            return
        if self.spawner is None:
            raise RuntimeError("an evaluation that runs candidate code needs a spawner (judge/coordinator/spawner.py)")
        self.accept_setup(self.group.start())
        if mode in ("check", "full"):
            self.check()
        if mode == "benchmark" or (mode == "full" and all(c.passed for c in self.result.cases)):
            self.benchmark()
        if mode == "profile":
            self.profile()

    def grade_isolation(self) -> None:
        """Name the kernel layers the trust model needs that the ranks could not apply (only where they ran)."""
        iso = self.result.isolation
        if not iso:
            return
        missing = []
        if not iso.get("seccomp"):
            missing.append("seccomp" + (f" ({iso['seccomp_error']})" if iso.get("seccomp_error") else ""))
        if not iso.get("landlock_abi"):
            missing.append("landlock" if self.req.landlock else "landlock (switched off by the request)")
        self.result.isolation_missing = missing
        self.result.leaderboard_grade = not missing or self.req.accept_weak_isolation

    def finish(self) -> JudgeResult:
        self.grade_isolation()
        r = self.result
        if r.violations and r.verdict in (Verdict.passed, Verdict.wrong_answer, Verdict.runtime_error):
            r.verdict = Verdict.forbidden
            r.summary = f"rule broken at run time: {r.violations[0].detail}"
        elif r.verdict == Verdict.passed:
            failed = [c for c in r.cases if not c.passed]
            bad_bench = [s for s in r.benchmark if not s.verified]
            if failed:
                r.verdict = Verdict.wrong_answer
                r.summary = f"{len(r.cases) - len(failed)}/{len(r.cases)} cases passed"
            elif bad_bench:
                r.verdict = Verdict.wrong_answer
                r.summary = f"wrong output in a timed iteration at size {bad_bench[0].size_bytes} B"
            else:
                parts = []
                if r.cases:
                    parts.append(f"all {len(r.cases)} cases passed")
                if r.benchmark:
                    parts.append(f"benchmarked {len(r.benchmark)} sizes")
                if r.profile:
                    parts.append(f"profiled {len(r.profile)} ranks")
                r.summary = "; ".join(parts) or "ok"
        if self.req.cleanup:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.timings.total_s = time.monotonic() - self.t_start
        r.timings = self.timings
        return r


def _same(a, b) -> bool:
    """Equal in shape, dtype and every value (NaN equal to NaN)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a, b)) or (a.is_floating_point() and bool(torch.equal(a.isnan(), b.isnan()))
                                       and bool(torch.equal(a.nan_to_num(), b.nan_to_num())))


def evaluate(req: JudgeRequest, spawner: "Spawner") -> JudgeResult:
    """Run one evaluation to completion. Must be called in a process that will not run candidate code; every
    candidate process comes from `spawner`, forked before this process read the request."""
    return Evaluation(req, spawner).run()
