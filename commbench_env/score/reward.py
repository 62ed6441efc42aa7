"""Reward: a pure function of a JudgeResult and reference figures measured on the same hardware.

    reward = 0                                              if not correct (plus optional shaping credit)
    reward = w_c + (1 - w_c) * perf_score                   if correct
    perf_score = clip(1 + log(speedup) / log(speed_floor), 0, 1)
    speedup = geometric mean over benchmark sizes of t_reference / t_candidate (median iteration, max over ranks)

With the defaults (w_c = 0.5, speed_floor = 8): as fast as the reference or faster -> 1.0; half as fast -> 0.83;
8x slower or worse -> 0.5; wrong -> 0. Bounded in [0, 1], monotonic in correctness and in bandwidth.

How that reward is spread over the turns of an episode is a separate choice (TurnRewardConfig, `turn_reward=` in
the env): the final reward on the last turn only (the default), improvement deltas of per-turn scores, or the
final reward credited back to every turn with a discount.
"""

from __future__ import annotations

import math
from typing import Literal, Protocol

from pydantic import Field

from ..config import StrictModel
from ..judge.host.result import JudgeResult, SizeResult, Verdict

Band = Literal["better", "on_par", "degraded", "severely_degraded"]


class RewardConfig(StrictModel):
    correctness_weight: float = Field(default=0.5, ge=0, le=1, description="reward of a correct but slowest solution")
    speed_floor: float = Field(default=8.0, gt=1, description="slowdown at which the performance part reaches 0")
    compile_credit: float = Field(default=0.0, ge=0, le=1, description="shaping: reward of incorrect code that compiles")
    case_credit: float = Field(default=0.0, ge=0, le=1, description="shaping: reward per fraction of cases passed")
    better_above: float = Field(default=0.05, description="relative gain over the reference counted as 'better'")
    on_par_within: float = Field(default=0.05, description="|relative change| counted as 'on_par'")
    severe_below: float = Field(default=-0.40, description="relative change below which it is 'severely_degraded'")
    speed_basis: Literal["reference", "roofline"] = Field(
        default="reference", description="what the speed part measures against: the expert reference on the same "
        "hardware (t_reference / t_candidate), or the speed of light: the share of the roofline the candidate "
        "reaches (where the judge measured one, i.e. on GPUs); perf = min(1, share / roofline_target)")
    roofline_target: float = Field(default=0.8, gt=0, le=1, description="speed_basis roofline: the share of the "
                                   "roofline that earns the whole speed part")


class SizeComparison(StrictModel):
    size_bytes: int
    candidate_us: float
    reference_us: float
    speedup: float


class RewardBreakdown(StrictModel):
    reward: float
    correct: bool
    compiled: bool
    case_fraction: float
    speedup: float | None = None
    perf_score: float | None = None
    band: Band | None = None
    sizes: list[SizeComparison] = Field(default_factory=list)
    roofline_share: float | None = Field(default=None, description="geometric mean over the benchmark sizes of the "
                                         "share of the roofline reached (speed of light = 1), where measured")
    note: str = ""


def scored(s: SizeResult) -> float:
    """The time a size is scored on (SizeResult.scored_us)."""
    return s.scored_us


def speedup_vs_reference(candidate: list[SizeResult], reference: list[SizeResult]) -> tuple[float | None, list[SizeComparison]]:
    """Per size, t_reference / t_candidate on the median iteration (max over ranks): the mean that nccl-tests
    reports is kept for display, but one descheduled iteration should not move a reward."""
    ref = {s.size_bytes: s for s in reference}
    rows = [SizeComparison(size_bytes=c.size_bytes, candidate_us=scored(c), reference_us=scored(ref[c.size_bytes]),
                           speedup=scored(ref[c.size_bytes]) / scored(c))
            for c in candidate if c.size_bytes in ref and scored(c) > 0 and scored(ref[c.size_bytes]) > 0]
    if not rows:
        return None, rows
    return math.exp(sum(math.log(r.speedup) for r in rows) / len(rows)), rows


def band_of(speedup: float, cfg: RewardConfig) -> Band:
    """The anchor benchmark's per-task verdict from the relative performance change."""
    change = speedup - 1.0
    if change > cfg.better_above:
        return "better"
    if abs(change) <= cfg.on_par_within:
        return "on_par"
    if change >= cfg.severe_below:
        return "degraded"
    return "severely_degraded"


def compute_reward(result: JudgeResult, reference: list[SizeResult] | None, cfg: RewardConfig | None = None) -> RewardBreakdown:
    cfg = cfg or RewardConfig()
    compiled = result.verdict not in (Verdict.compile_error, Verdict.forbidden)
    correct = result.correct and all(s.verified for s in result.benchmark)
    if result.verdict == Verdict.forbidden:
        return RewardBreakdown(reward=0.0, correct=False, compiled=False, case_fraction=result.case_fraction,
                               note="rule violation: scored zero")
    if not correct:
        shaped = (cfg.compile_credit if compiled else 0.0) + cfg.case_credit * result.case_fraction
        return RewardBreakdown(reward=min(shaped, cfg.correctness_weight), correct=False, compiled=compiled,
                               case_fraction=result.case_fraction, note=f"not correct ({result.verdict.value})")
    speedup, rows = speedup_vs_reference(result.benchmark, reference or [])
    share = roofline_share(result.benchmark)
    if cfg.speed_basis == "roofline":
        if share is None:
            return RewardBreakdown(reward=cfg.correctness_weight, correct=True, compiled=True, case_fraction=1.0,
                                   speedup=speedup, band=band_of(speedup, cfg) if speedup else None, sizes=rows,
                                   note="correct; no roofline was measured here (CPU), so no speed part")
        perf = min(1.0, share / cfg.roofline_target)
        return RewardBreakdown(reward=cfg.correctness_weight + (1 - cfg.correctness_weight) * perf, correct=True,
                               compiled=True, case_fraction=1.0, speedup=speedup, perf_score=perf,
                               band=band_of(speedup, cfg) if speedup else None, sizes=rows, roofline_share=share)
    if speedup is None:
        return RewardBreakdown(reward=cfg.correctness_weight, correct=True, compiled=True, case_fraction=1.0,
                               roofline_share=share, note="correct; no reference figures to compare speed with")
    perf = min(1.0, max(0.0, 1.0 + math.log(speedup) / math.log(cfg.speed_floor)))
    return RewardBreakdown(reward=cfg.correctness_weight + (1 - cfg.correctness_weight) * perf, correct=True,
                           compiled=True, case_fraction=1.0, speedup=speedup, perf_score=perf,
                           band=band_of(speedup, cfg), sizes=rows, roofline_share=share)


def roofline_share(sizes: list[SizeResult]) -> float | None:
    """Geometric mean of the share of the roofline each size reached (roofline_pct / 100): the measured roofline on
    GPUs, the link model's port on CPUs (modelled); None for latency metrics."""
    pcts = [s.modelled.roofline_pct if s.modelled is not None else s.roofline_pct for s in sizes]
    shares = [p / 100 for p in pcts if p is not None and p > 0]
    if not shares or len(shares) != len(sizes):
        return None
    return math.exp(sum(math.log(x) for x in shares) / len(shares))


# -- per-turn schedules ---------------------------------------------------------------------------------------
class TurnRewardConfig(StrictModel):
    """Which reward each step returns. A turn's score s_t is `compute_reward` of that turn's result (correctness and
    shaping only: intermediate turns have no reference timing), and the final reward on the turn that ends the
    episode (0 if the episode ends unscored). A turn that judged nothing (unparseable action) keeps s_{t-1}.

    - final: 0 on every turn but the last, which returns the final reward R (the default; the behaviour before
      schedules existed).
    - improvement: r_t = s_t - s_{t-1} (baseline "previous", s_0 = 0: the rewards of an episode sum to R), or
      r_t = s_t - max(s_0..s_{t-1}) (baseline "best": a regression is charged against the best code so far).
    - discounted: steps return what `final` returns, and the last step's info carries `turn_rewards`, the final
      reward credited to each turn t of T as gamma^(T - t) * R (a per-turn return for trainers that treat turns as
      separate samples; it can only be known when the episode ends).

    Every mode puts the list the episode earned per turn in the last step's `info["turn_rewards"]`.
    """

    mode: Literal["final", "improvement", "discounted"] = "final"
    baseline: Literal["previous", "best"] = Field(default="previous", description="improvement: subtract the "
                                                  "previous turn's score or the best score so far")
    gamma: float = Field(default=0.9, gt=0, le=1, description="discounted: credit per turn back from the last")


class RewardSchedule(Protocol):
    """How an episode's turns are rewarded: fed each turn's score (and the final reward on the last turn), it
    returns that step's reward. `TurnCredit` implements the built-in modes; `Episode(reward_schedule=...)` takes
    any callable that makes one from the episode's TurnRewardConfig."""

    scores: list[float]

    def step(self, score: float | None, final: float | None = None) -> float: ...

    def turn_rewards(self) -> list[float]: ...


class TurnCredit:
    """One episode's bookkeeping for a TurnRewardConfig: feed each turn's score, get the reward to return."""

    def __init__(self, cfg: TurnRewardConfig | None = None):
        self.cfg = cfg or TurnRewardConfig()
        self.scores: list[float] = []
        self.rewards: list[float] = []
        self.final: float | None = None

    def step(self, score: float | None, final: float | None = None) -> float:
        """`score`: this turn's score (None: nothing was judged). `final`: the final reward if this turn ends the
        episode. Returns this step's reward."""
        prev = self.scores[-1] if self.scores else 0.0
        best = max([0.0, *self.scores])
        s = final if final is not None else (prev if score is None else score)
        self.scores.append(s)
        if final is not None:
            self.final = final
        if self.cfg.mode == "improvement":
            r = s - (prev if self.cfg.baseline == "previous" else best)
        else:
            r = final if final is not None else 0.0
        self.rewards.append(r)
        return r

    def turn_rewards(self) -> list[float]:
        """Per turn: what each turn earned under the schedule (meaningful once the episode has ended)."""
        if self.cfg.mode == "discounted" and self.final is not None:
            n = len(self.scores)
            return [self.cfg.gamma ** (n - 1 - t) * self.final for t in range(n)]
        return list(self.rewards)
