"""Benchmark feedback says what the speed is judged against: latency tasks read as latency, a benchmark turn shows
the expert reference's time per size before any submission, and a CUDA build that succeeds shows ptxas's
resource lines."""

from __future__ import annotations

from commbench_env.cards import load_task
from commbench_env.episode import Episode
from commbench_env.judge.host.result import CompileReport, JudgeResult, SizeResult


def _size(size: int, us: float) -> SizeResult:
    return SizeResult(size_bytes=size, dtype="float32", count=max(1, size // 4), iters=5, warmup=1, time_us=us,
                      time_us_median=us, time_us_min=us, per_rank_mean_us=[us, us], algbw_gbps=1.0, busbw_gbps=2.0)


def test_a_latency_task_reads_as_latency():
    r = JudgeResult(task_id="t", task_hash="h", mode="benchmark", world_size=2, device_mode="cpu", verdict="pass",
                    metric="latency", benchmark=[_size(4, 12.5)])
    text = r.feedback()
    assert "latency_us" in text and "12.50" in text and "busbw" not in text and "GB/s" not in text


def test_a_successful_cuda_build_shows_ptxas_resources():
    log = ("ptxas info    : Compiling entry function '_Z4copyPKfPfi' for 'sm_90a'\n"
           "ptxas info    : Used 16 registers, 380 bytes cmem[0]\n")
    r = JudgeResult(task_id="t", task_hash="h", mode="compile", world_size=2, device_mode="cuda", verdict="compiled",
                    compile=CompileReport(ok=True, log=log))
    text = r.feedback()
    assert "ptxas (per kernel" in text and "Used 16 registers" in text and "compile log" not in text


def test_a_benchmark_turn_shows_the_reference_target(tmp_path):
    task = "p2p/ring_shift"
    ep = Episode(task=task, max_turns=3, world_size=2, trace_dir=str(tmp_path))
    try:
        ep.start()
        out = ep.step({"tool": "benchmark", "source": load_task(task).reference_source()})
    finally:
        ep.close()
    assert out.verdict == "pass" and not out.done
    assert "target: the expert reference on this hardware" in out.feedback
    sizes = [s.size_bytes for s in out.result.benchmark]
    rows = [ln for ln in out.feedback.split("target:")[1].splitlines()[2:] if ln.strip()]
    assert [int(ln.split()[0]) for ln in rows] == sizes and all(ln.split()[3].endswith("x") for ln in rows)


def test_a_tflops_task_says_its_roofline_column_is_not_the_score():
    from commbench_env.judge.host.result import Roofline

    s = _size(1 << 20, 40.0).model_copy(update={"tflops": 120.0, "roofline_pct": 3.0})
    r = JudgeResult(task_id="t", task_hash="h", mode="benchmark", world_size=2, device_mode="cuda-shared",
                    verdict="pass", metric="tflops", benchmark=[s],
                    roofline=Roofline(name="device copy", gbps=2000.0, per_rank_gbps=1000.0, emulated=True))
    text = r.feedback()
    assert "TFLOP/s is scored here" in text and "120.0000" in text
    busbw = r.model_copy(update={"metric": "busbw"}).feedback()
    assert "TFLOP/s is scored here" not in busbw
