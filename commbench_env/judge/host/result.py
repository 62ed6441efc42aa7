"""The judge's result: a versioned, typed record of one evaluation. Torch-free so the host can read it anywhere."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import Field

from ...config import StrictModel

SCHEMA_VERSION = "1.3"  # 1.1: roofline, roofline_pct, ncu; 1.2: SizeResult.roofline_gbps; 1.3: time_us_scored,
# clock_bounded, isolation_missing, leaderboard_grade

Mode = Literal["compile", "check", "benchmark", "profile", "full", "sanitize"]
MODES: tuple[str, ...] = ("compile", "check", "benchmark", "profile", "full", "sanitize")


class Verdict(str, Enum):
    passed = "pass"
    wrong_answer = "wrong_answer"
    compile_error = "compile_error"
    runtime_error = "runtime_error"
    timeout = "timeout"
    forbidden = "forbidden"
    infra_error = "infra_error"
    compiled = "compiled"  # mode=compile succeeded; nothing was run


class Mismatch(StrictModel):
    """The first wrong element: where it is and what was expected."""

    case: str
    rank: int
    output: str
    reason: Literal["value", "shape", "dtype", "type", "missing", "nan", "semantics", "input_mutated", "timing"]
    index: list[int] = Field(default_factory=list)
    expected: str = ""
    got: str = ""
    detail: str = ""
    hidden: bool = False
    wrong_count: int = 0
    total_count: int = 0
    abs_error: float | None = Field(default=None, description="|got - expected| at `index`")
    rel_error: float | None = Field(default=None, description="abs_error / |expected| at `index`")
    rtol: float | None = None
    atol: float | None = None
    worst_tolerance_ratio: float | None = Field(default=None, description="over the wrong elements, the largest "
                                                "|got - expected| / (atol + rtol |expected|): 1 is the edge")


class Violation(StrictModel):
    rule: str
    detail: str
    where: Literal["static", "runtime"]
    line: int | None = None
    rank: int | None = None


class CompileReport(StrictModel):
    ok: bool
    log: str = ""
    violations: list[Violation] = Field(default_factory=list)
    cache_hit: bool = False
    seconds: float = 0.0


class CaseResult(StrictModel):
    name: str
    visible: bool
    passed: bool
    seconds: float = 0.0
    error: str | None = None
    mismatch: Mismatch | None = None


class WorldCheck(StrictModel):
    """A check of the same code at another world size than the episode's (judge/host/worlds.py)."""

    world: int
    verdict: Verdict
    passed: int
    total: int


class ModelledTime(StrictModel):
    """A CPU call's communication timed on a link model instead of a clock (judge/coordinator/comm_model.py):
    deterministic, so the CPU reward says something about the algorithm. Max over ranks; median over iterations."""

    link_model: str = Field(description="the sandbox profile's link model, e.g. h200-nvswitch")
    port_gbps: float
    alpha_us: float
    overhead_us: float = 0.0
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    roofline_pct: float | None = Field(default=None, description="the metric's modelled bandwidth as % of the "
                                       "link model's port bandwidth")
    messages: int = Field(description="point-to-point messages per call, all ranks")
    bytes_moved: int = Field(description="point-to-point bytes per call, all ranks")
    collectives: int = Field(default=0, description="library collectives per call")
    max_rank_bytes_out: int = 0
    max_rank_bytes_in: int = 0
    spread_us: float = Field(default=0.0, description="max - min over the timed iterations (0 when the "
                             "submission communicates the same way every call)")


class SizeResult(StrictModel):
    """One benchmark size, nccl-tests style: time is the mean over iterations, max over ranks."""

    size_bytes: int
    dtype: str
    count: int
    iters: int
    warmup: int
    time_us: float
    time_us_median: float
    time_us_min: float
    time_us_scored: float = Field(default=0.0, description="the time the reward uses: the median iteration where "
                                  "the coordinator releases one call at a time (CPU), the mean where calls run "
                                  "back-to-back (GPU), since a call that can see later calls' inputs can move work "
                                  "between them but not remove it; 0 in results older than this field: the median")
    clock_bounded: bool = Field(default=False, description="the ranks' own timings summed to less than the "
                                "coordinator's clock allows; the times were raised to that bound")
    per_rank_mean_us: list[float]
    algbw_gbps: float
    busbw_gbps: float
    tflops: float = 0.0
    roofline_gbps: float | None = Field(default=None, description="the most the metric can reach per rank: the "
                                        "roofline's per-rank share, less (in cuda-shared) the rank's own block that "
                                        "an all-gather or all-to-all copies but busbw does not count")
    roofline_pct: float | None = Field(default=None, description="the metric's bandwidth as % of roofline_gbps")
    verified: bool = True
    mismatch: Mismatch | None = None
    modelled: ModelledTime | None = Field(default=None, description="CPU: the call's communication on the "
                                          "profile's link model; when present, the reward scores it")
    extended_calls: int = Field(default=0, description="timed calls whose clock ran on to a device-wide sync: the "
                                "device still had work after the stop mark (queued later by a background thread, "
                                "or, in torch tasks, async work never waited for)")

    @property
    def scored_us(self) -> float:
        """The time this size is scored on: the modelled time on CPUs; else time_us_scored (the median in results
        older than that field)."""
        if self.modelled is not None:
            return self.modelled.time_us
        return self.time_us_scored or self.time_us_median

    @property
    def scored_busbw_gbps(self) -> float:
        """The bus bandwidth of the scored time: modelled on CPUs, measured on GPUs."""
        return self.modelled.busbw_gbps if self.modelled is not None else self.busbw_gbps


class Roofline(StrictModel):
    """What bandwidth figures are measured against, found on the rank's own hardware during the evaluation."""

    name: str
    gbps: float = Field(description="the whole ceiling: device copy (cuda-shared) or one GPU's NVLink per direction")
    per_rank_gbps: float = Field(description="each rank's share of it: gbps / world in cuda-shared, gbps in cuda")
    emulated: bool = Field(description="true in cuda-shared: the ranks share one GPU, nothing crosses a link")


class ProfileRow(StrictModel):
    name: str
    kind: Literal["comm", "compute", "other"]
    calls: int
    total_us: float
    mean_us: float
    gbps: float | None = Field(default=None, description="GPU kernels: the op's bytes per rank over this kernel's "
                               "mean time, i.e. the bandwidth it achieves if it alone moves them")


def kernel_bandwidth(rows: list[dict], op_bytes: int, gpu_rows_only: bool) -> list[dict]:
    """Add `gbps` to the GPU kernel rows of a profile table (rows named '[gpu] ...' when `gpu_rows_only`)."""
    out = []
    for row in rows:
        row = dict(row)
        is_kernel = not gpu_rows_only or str(row.get("name", "")).startswith("[gpu]")
        if is_kernel and op_bytes > 0 and row.get("mean_us", 0) > 0:
            row["gbps"] = op_bytes / (row["mean_us"] * 1e-6) / 1e9
        out.append(row)
    return out


class RankProfile(StrictModel):
    rank: int
    case: str
    wall_us: float
    comm_us: float
    compute_us: float
    rows: list[ProfileRow] = Field(default_factory=list)
    # CUDA tasks: every rank runs in one process. The device host tells each rank's kernels apart by stream and GPU
    # (rows_of_own_kernels); where it cannot, one table holds all ranks' kernels and is given with rank 0.
    rows_of_all_ranks: bool = False
    rows_of_own_kernels: bool = False


class SanitizerReport(StrictModel):
    """The findings of one external GPU tool run on the candidate: compute-sanitizer's checks, or ncu."""

    tool: str
    status: str = "ok"
    errors: int | None = None
    report: str = ""


class RankStatus(StrictModel):
    rank: int
    state: Literal["ok", "exited_early", "crashed", "hung", "killed", "not_started", "error"]
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    stack: str | None = None


class Timings(StrictModel):
    compile_s: float = 0.0
    launch_s: float = 0.0
    rendezvous_s: float = 0.0
    load_s: float = 0.0
    run_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0


class JudgeResult(StrictModel):
    schema_version: str = SCHEMA_VERSION
    judge_version: str = ""
    task_id: str
    task_hash: str
    source_hash: str = ""
    mode: Mode
    world_size: int
    device_mode: str
    verdict: Verdict
    summary: str = ""
    metric: Literal["busbw", "algbw", "latency", "tflops"] = Field(
        default="busbw", description="what the card's speed is judged on (its performance.metric)")
    roofline_bound: float = Field(default=1.0, description="the card's share of the roofline the metric can reach "
                                  "at best at this world size (roofline_pct is against roofline x bound)")
    roofline_reason: str = ""
    compile: CompileReport | None = None
    cases: list[CaseResult] = Field(default_factory=list)
    benchmark: list[SizeResult] = Field(default_factory=list)
    profile: list[RankProfile] = Field(default_factory=list)
    ranks: list[RankStatus] = Field(default_factory=list)
    violations: list[Violation] = Field(default_factory=list)
    timings: Timings = Field(default_factory=Timings)
    hardware: dict = Field(default_factory=dict)
    roofline: Roofline | None = None
    ncu: SanitizerReport | None = Field(default=None, description="Nsight Compute on the slowest kernel (profile mode)")
    isolation: dict = Field(default_factory=dict, description="which sandbox layers were active in the ranks, as "
                            "each rank reported them before any candidate code existed (the weakest rank's)")
    isolation_missing: list[str] = Field(default_factory=list, description="kernel layers the trust model needs "
                                         "that this host lacked (docs/trust-model.md)")
    leaderboard_grade: bool = Field(default=True, description="no layer was missing, or the sandbox profile "
                                    "accepts weak isolation (accept_weak_isolation); a result from a host that "
                                    "could not confine candidate code is not comparable on a leaderboard")
    sanitizer: list[SanitizerReport] = Field(default_factory=list)
    worlds: list[WorldCheck] = Field(default_factory=list, description="the other world sizes this code was "
                                     "checked at; their cases follow the episode world's, as hidden cases")

    @property
    def correct(self) -> bool:
        """All cases ran and passed (only meaningful for modes that check)."""
        return bool(self.cases) and all(c.passed for c in self.cases) and self.verdict == Verdict.passed

    @property
    def case_fraction(self) -> float:
        return sum(c.passed for c in self.cases) / len(self.cases) if self.cases else 0.0

    def public(self) -> "JudgeResult":
        """What the agent may see of this result: hidden cases by number ("hidden #2") and pass or fail, their
        names gone from every text (summary, errors, rank output) and their mismatches reduced to rank, output
        and kind, with no index, expected or got value. The full result stays host-side (traces, trainers)."""
        hidden = [c for c in self.cases if not c.visible]
        labels = {c.name: f"hidden #{i}" for i, c in enumerate(hidden, 1)}
        if not labels:
            return self
        order = sorted(labels, key=len, reverse=True)  # a name inside a longer one is replaced after it

        def scrub(text: str | None) -> str | None:
            if not text:
                return text
            for name in order:
                text = text.replace(name, labels[name])
            return text

        cases = []
        for c in self.cases:
            if c.visible:
                cases.append(c)
                continue
            mm = c.mismatch
            if mm is not None:
                # counts and how far off, relative to the tolerance: never an index, a shape or a value
                mm = Mismatch(case=labels[c.name], rank=mm.rank, output=mm.output, reason=mm.reason, hidden=True,
                              wrong_count=mm.wrong_count, worst_tolerance_ratio=mm.worst_tolerance_ratio)
            cases.append(c.model_copy(update={"name": labels[c.name], "mismatch": mm, "error": scrub(c.error)}))
        ranks = [k.model_copy(update={"stdout": scrub(k.stdout), "stderr": scrub(k.stderr), "stack": scrub(k.stack)})
                 for k in self.ranks]
        return self.model_copy(update={"summary": scrub(self.summary), "cases": cases, "ranks": ranks})

    def feedback(self, max_chars: int = 6000) -> str:
        """Text for the agent, from `public()`: hidden cases are named by number only."""
        from .feedback import render_feedback

        return render_feedback(self.public(), max_chars=max_chars)
