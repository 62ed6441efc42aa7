"""Judging more than one world size. An algorithm that works only at the world it was tried on (a recursive
doubling that needs a power of two, an index that assumes two ranks) is not correct: a check or a submission is
also judged at other world sizes the card lists, one of them not a power of two where the card has one. Those
worlds' cases are hidden cases (numbered, no values); the feedback says which world failed."""

from __future__ import annotations

from .result import CaseResult, JudgeResult, Verdict, WorldCheck


def other_worlds(sizes: list[int], world: int, count: int, max_world: int | None = None) -> list[int]:
    """Up to `count` world sizes besides `world`, from the card's `sizes` (those above `max_world`, the GPUs a
    `cuda` run has, left out): first a size that is not a power of two, then the sizes nearest `world`."""
    pool = [s for s in sizes if s != world and (max_world is None or s <= max_world)]
    odd = [s for s in pool if s & (s - 1)]
    ordered = sorted(odd, key=lambda s: (abs(s - world), s))[:1]
    ordered += sorted((s for s in pool if s not in ordered), key=lambda s: (abs(s - world), s))
    return ordered[:max(0, count)]


def merge_worlds(primary: JudgeResult, others: list[JudgeResult]) -> JudgeResult:
    """`primary` (the episode's world, with its benchmark) with the other worlds' checks folded in: their cases
    appended as hidden cases, their verdicts in `worlds`, and the verdict the first failing world's."""
    if not others:
        return primary
    cases = list(primary.cases)
    checks = []
    for o in others:
        cases += [CaseResult(name=f"world {o.world_size}: {c.name}", visible=False, passed=c.passed, seconds=c.seconds,
                             error=c.error, mismatch=c.mismatch.model_copy(update={"case": f"world {o.world_size}: "
                                                                                            f"{c.mismatch.case}"})
                             if c.mismatch else None) for c in o.cases]
        checks.append(WorldCheck(world=o.world_size, verdict=o.verdict, passed=sum(c.passed for c in o.cases),
                                 total=len(o.cases)))
    failed = next((o for o in others if o.verdict != Verdict.passed), None)
    update: dict = {"cases": cases, "worlds": checks,
                    "timings": primary.timings.model_copy(update={
                        "run_s": primary.timings.run_s + sum(o.timings.run_s for o in others),
                        "total_s": primary.timings.total_s + sum(o.timings.total_s for o in others)})}
    if failed is not None:
        update["verdict"] = failed.verdict
        update["summary"] = (f"correct at world {primary.world_size}, but {failed.verdict.value} at world "
                             f"{failed.world_size} (code is also checked at other world sizes the card lists): "
                             f"{failed.summary}")
        update["violations"] = [*primary.violations, *failed.violations]
    else:
        update["summary"] = (f"{primary.summary} at world {primary.world_size}; also correct at world "
                             + ", ".join(f"{o.world_size} ({len(o.cases)} more cases)" for o in others))
    return primary.model_copy(update=update)
