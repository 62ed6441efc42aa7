"""Turn a JudgeResult into the text an agent reads (`JudgeResult.feedback`, which renders its `public()` view:
hidden cases by number, their mismatches without values)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .result import JudgeResult, Mismatch, SizeResult


def _mismatch_line(m: "Mismatch") -> str:
    """One line on the first wrong element. For hidden cases: no index, counts or shapes (they reveal the case)."""
    where = f"rank {m.rank}, output {m.output!r}"
    if m.index and not m.hidden:
        where += f", index {m.index}"
    if m.reason in ("value", "nan") and m.hidden:
        s = f"{where}: {'wrong values' if m.reason == 'value' else 'NaN where a number was expected'}"
        if m.wrong_count:
            s += f" ({m.wrong_count} element{'s' if m.wrong_count != 1 else ''} wrong"
            if m.worst_tolerance_ratio is not None:
                s += f", the worst {_ratio(m.worst_tolerance_ratio)} the tolerance"
            s += ")"
    elif m.reason in ("value", "nan"):
        s = f"{where}: expected {m.expected}, got {m.got}"
        if m.abs_error is not None:
            s += f" (abs error {m.abs_error:.3g}" + (f", rel error {m.rel_error:.3g}" if m.rel_error is not None
                                                     else "") + ")"
        if m.rtol is not None:
            s += f"; tolerance |got - expected| <= {m.atol:.3g} + {m.rtol:.3g} * |expected|"
        if m.total_count:
            s += f"; {m.wrong_count} of {m.total_count} elements wrong"
            if m.worst_tolerance_ratio is not None and m.wrong_count > 1:
                s += f", the worst {_ratio(m.worst_tolerance_ratio)} the tolerance"
    elif m.reason == "shape":
        if m.hidden:
            s = f"{where}: wrong shape"
        else:
            s = f"{where}: wrong shape, expected {m.expected}, got {m.got}" if m.expected else f"{where}: {m.detail}"
    elif m.reason == "dtype":
        s = f"{where}: wrong dtype, expected {m.expected}, got {m.got}" if m.expected else f"{where}: wrong dtype"
    elif m.reason == "timing":
        s = f"rank {m.rank} timed fastest: {m.detail}"
    else:
        s = f"{where}: {m.detail or m.reason}"
    if m.detail and m.reason in ("value", "nan", "shape") and m.detail not in s and not m.hidden:
        s += f" [{m.detail}]"
    return s


def _ratio(r: float) -> str:
    return f"{r:.3g} times" if r >= 10 else f"{r:.2f}x"


def render_feedback(r: "JudgeResult", max_chars: int = 6000) -> str:
    """The text of `r` as given (callers pass `r.public()` for an agent)."""
    lines = [f"[{r.mode}] verdict: {r.verdict.value} - {r.summary}"]
    if r.compile and r.compile.log and (not r.compile.ok or r.verdict.value in ("compile_error", "forbidden")):
        lines += ["", "compile log:", r.compile.log.strip()]
    elif r.compile and r.compile.ok:
        resources = [ln.strip() for ln in r.compile.log.splitlines()
                     if ln.strip().startswith("ptxas info") or "bytes stack frame" in ln]
        if resources:
            lines += ["", "ptxas (per kernel: registers, spills, shared and constant memory):"]
            lines += ["  " + ln for ln in resources[:16]] + ([f"  [... {len(resources) - 16} more lines]"]
                                                              if len(resources) > 16 else [])
    if r.cases:
        lines += ["", "cases:"]
        for c in r.cases:
            status = "PASS" if c.passed else "FAIL"
            line = f"  {status} {c.name}"
            if c.mismatch:
                line += ": " + _mismatch_line(c.mismatch)
            elif c.error and not c.passed:
                last = [ln for ln in c.error.splitlines() if ln.strip()]
                line += ": " + (last[-1].strip() if last else "error")
            lines.append(line)
    if r.worlds:
        lines += ["", f"world sizes judged: {r.world_size} (this episode's)"
                  + "".join(f"; {w.world}: {w.verdict.value}, {w.passed} of {w.total} cases passed" for w in r.worlds)
                  + " (the cases of other worlds are listed as hidden)"]
    modelled = [s for s in r.benchmark if s.modelled is not None]
    if modelled:
        m = modelled[0].modelled
        latency = r.metric == "latency"
        lines += ["", f"benchmark, modelled (the CPU reward scores this): your calls' messages, in the order and "
                  f"with the dependencies they had, timed on {m.link_model} ({m.port_gbps:g} GB/s per direction per "
                  f"rank, {m.alpha_us:g} us latency and {m.overhead_us:g} us of the sender's port per message); the "
                  "same code on the same inputs gives the same figure every run; local "
                  "computation is not counted; wall_us is this machine's clock, for reference only:",
                  f"  {'size':>12} {'model_us':>10}" + ("" if latency else f" {'algbw GB/s':>11} {'busbw GB/s':>11} "
                                                         f"{'of link':>7}")
                  + f" {'messages':>8} {'p2p out B':>10} {'wall_us':>10}  ok"]
        for s in r.benchmark:
            mt = s.modelled
            ok = "yes" if s.verified else ("NO: " + _mismatch_line(s.mismatch) if s.mismatch else "NO")
            if mt is None:
                continue
            pct = f"{mt.roofline_pct:.0f}%" if mt.roofline_pct is not None else "-"
            lines.append(f"  {s.size_bytes:>12} {mt.time_us:>10.2f}"
                         + ("" if latency else f" {mt.algbw_gbps:>11.2f} {mt.busbw_gbps:>11.2f} {pct:>7}")
                         + f" {mt.messages + mt.collectives:>8} {mt.max_rank_bytes_out:>10} {s.time_us:>10.0f}  {ok}")
        if r.metric == "tflops":
            lines.append("  this task's metric is TFLOP/s, but on CPUs only communication is modelled: the reward "
                         "compares the modelled times above (computation counts on GPUs)")
        varied = [s for s in modelled if s.modelled.spread_us > 0]
        if varied:
            lines.append("  your calls communicated differently from call to call at "
                         + ", ".join(f"{s.size_bytes} B (spread {s.modelled.spread_us:.1f} us)" for s in varied)
                         + "; the median call is scored")
    elif r.benchmark and r.metric == "latency":
        lines += ["", "benchmark (latency: time of one call, max over ranks; the reward compares the median "
                  "iteration on CPUs, the mean on GPUs):",
                  f"  {'size':>12} {'latency_us':>11} {'median_us':>10} {'min_us':>9}  ok"]
        for s in r.benchmark:
            ok = "yes" if s.verified else ("NO: " + _mismatch_line(s.mismatch) if s.mismatch else "NO")
            lines.append(f"  {s.size_bytes:>12} {s.time_us:>11.2f} {s.time_us_median:>10.2f} {s.time_us_min:>9.2f}"
                         f"  {ok}")
    elif r.benchmark:
        flops = any(s.tflops for s in r.benchmark)
        roof = any(s.roofline_pct is not None for s in r.benchmark)
        lines += ["", f"benchmark ({r.metric} is scored; time_us = mean over iterations as nccl-tests reports it, "
                  "max over ranks; the reward compares the median iteration on CPUs, the mean on GPUs):",
                  f"  {'size':>12} {'time_us':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}"
                  + (f" {'TFLOP/s':>9}" if flops else "") + (f" {'roofline':>8}" if roof else "") + "  ok"]
        for s in r.benchmark:
            ok = "yes" if s.verified else ("NO: " + _mismatch_line(s.mismatch) if s.mismatch else "NO")
            pct = f"{s.roofline_pct:.0f}%" if s.roofline_pct is not None else "-"
            lines.append(f"  {s.size_bytes:>12} {s.time_us:>10.1f} {s.algbw_gbps:>11.3f} {s.busbw_gbps:>11.3f}"
                         + (f" {s.tflops:>9.4f}" if flops else "") + (f" {pct:>8}" if roof else "") + f"  {ok}")
    if r.benchmark:
        extended = [s for s in r.benchmark if s.extended_calls]
        if extended:
            lines.append("  the device still had work after the stream the judge times (`stream` in CUDA tasks, the "
                         "current stream in torch tasks) had finished your calls, in "
                         + ", ".join(f"{s.extended_calls} calls at {s.size_bytes} B" for s in extended)
                         + ": the clock ran on to a device-wide sync (join side streams back to `stream`; wait() "
                           "on async work before returning)")
        if r.roofline and r.metric != "latency":
            lines.append(f"  roofline: {r.roofline.name}, {r.roofline.per_rank_gbps:.0f} GB/s per rank"
                         + (" (emulated: all ranks share one GPU, nothing crosses NVLink)" if r.roofline.emulated else ""))
            if r.roofline_bound < 1:
                lines.append(f"  this task's bound is {r.roofline_bound:g} of it ({r.roofline_reason}); the "
                             "roofline column is against that bound")
            if r.metric == "tflops":
                lines.append("  (TFLOP/s is scored here: the roofline column only says how much of the link the data "
                             "your calls move takes, as busbw)")
            less = [s.roofline_gbps for s in r.benchmark if s.roofline_gbps and s.roofline_gbps < r.roofline.per_rank_gbps]
            if less:
                lines.append(f"  busbw can reach only {less[-1]:.0f} GB/s per rank of it: each rank also copies its own "
                             "block, which busbw does not count but which takes the same copy bandwidth here")
    if r.profile:
        lines += ["", "profile (one call, per rank):"]
        one_table = any(q.rows_of_all_ranks for q in r.profile)  # CUDA task: one process, one kernel table
        for p in r.profile:
            if one_table:
                lines.append(f"  rank {p.rank}: wall {p.wall_us:.0f} us"
                             + (" (the kernels of every rank, which share one process:)" if p.rows_of_all_ranks else ""))
            elif p.rows_of_own_kernels:
                lines.append(f"  rank {p.rank}: wall {p.wall_us:.0f} us, its kernels:")
            else:
                lines.append(f"  rank {p.rank}: wall {p.wall_us:.0f} us, in torch.distributed {p.comm_us:.0f} us, "
                             f"other {p.compute_us:.0f} us")
            for row in p.rows[:8]:
                lines.append(f"    {row.kind:<8} {row.name:<40} calls {row.calls:>4}  total {row.total_us:>9.1f} us"
                             + (f"  {row.gbps:.1f} GB/s" if row.gbps else ""))
    if r.ncu:
        lines += ["", f"Nsight Compute ({r.ncu.status}):", _indent(r.ncu.report, 2, max_lines=30)]
    for sr in r.sanitizer:
        lines += ["", f"compute-sanitizer {sr.tool}: {sr.errors if sr.errors is not None else '?'} error(s) ({sr.status})"]
        if sr.errors:
            lines.append(_indent(sr.report, 2, max_lines=25))
    if r.violations:
        lines += ["", "rule violations:"]
        lines += [f"  {v.where}{' line ' + str(v.line) if v.line else ''}{' rank ' + str(v.rank) if v.rank is not None else ''}: {v.detail}"
                  for v in r.violations[:10]]
    interesting = [k for k in r.ranks if k.state != "ok" or k.stderr or k.stdout]
    for k in interesting[:4]:
        head = f"rank {k.rank}: {k.state}"
        if k.signal:
            head += f" (signal {k.signal})"
        elif k.exit_code not in (None, 0):
            head += f" (exit code {k.exit_code})"
        lines += ["", head]
        if k.stack:
            lines += ["  Python stack when stopped:", _indent(k.stack, 4)]
        if k.stdout.strip():
            lines += ["  stdout:", _indent(k.stdout, 4)]
        if k.stderr.strip():
            lines += ["  stderr:", _indent(k.stderr, 4)]
    text = "\n".join(lines)
    if len(text) > max_chars:
        text = text[: max_chars - 40] + f"\n[... feedback cut at {max_chars} characters ...]"
    return text


def _indent(text: str, n: int, max_lines: int = 30) -> str:
    ls = text.rstrip().splitlines()
    if len(ls) > max_lines:
        ls = ls[:5] + [f"[... {len(ls) - max_lines} lines ...]"] + ls[-(max_lines - 6):]
    return "\n".join(" " * n + line for line in ls)


def render_targets(candidate: list[SizeResult], reference: list[SizeResult], metric: str) -> str:
    """Per benchmark size: the expert reference's time on this hardware next to yours (what the speed part of the
    reward compares; the median iteration on CPUs, the mean on GPUs) and, where measured, its share of the
    roofline."""
    ref = {s.size_bytes: s for s in reference}
    rows = [(c, ref[c.size_bytes]) for c in candidate if c.size_bytes in ref]
    if not rows:
        return ""
    roof = any(r.roofline_pct is not None for _, r in rows)
    lines = ["", f"target: the expert reference on this hardware ({metric} is scored; speedup = reference time / yours):",
             f"  {'size':>12} {'yours_us':>10} {'reference_us':>13} {'speedup':>8}" + (f" {'ref roofline':>13}" if roof else "")]
    for c, r in rows:
        yours, theirs = c.scored_us, r.scored_us
        speed = f"{theirs / yours:.2f}x" if yours > 0 else "-"
        pct = f"{r.roofline_pct:.0f}%" if r.roofline_pct is not None else "-"
        lines.append(f"  {c.size_bytes:>12} {yours:>10.1f} {theirs:>13.1f} {speed:>8}" + (f" {pct:>13}" if roof else ""))
    return "\n" + "\n".join(lines)
