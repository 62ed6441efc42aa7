"""The roofline every GPU figure is reported against: how it is found, how it reaches the agent and the viewer.

The measurement itself needs a GPU (benchmarks/gpu_validate.py runs it there); here: what a CPU rank reports,
the percentage the coordinator derives, the feedback text and the viewer's turn data.
"""

from __future__ import annotations

import pytest
import torch

from commbench_env.judge.candidate import roofline
from commbench_env.judge.host.result import JudgeResult, Roofline, SizeResult, Verdict
from commbench_env.trace.viewer.data import episode_view


def _size(busbw: float, pct: float | None) -> SizeResult:
    return SizeResult(size_bytes=64 << 20, dtype="float32", count=1 << 24, iters=5, warmup=2, time_us=100.0,
                      time_us_median=100.0, time_us_min=99.0, per_rank_mean_us=[100.0, 98.0], algbw_gbps=busbw,
                      busbw_gbps=busbw, roofline_pct=pct)


def test_cpu_has_no_roofline():
    assert roofline.measure(torch, "cpu", 2, []) is None


def test_cpu_judge_results_carry_no_roofline(evaluate):
    res = evaluate("collective/allreduce_ring", mode="benchmark", world=2)
    assert res.verdict == Verdict.passed and res.roofline is None
    assert all(s.roofline_pct is None for s in res.benchmark)
    assert "roofline" not in res.feedback()


def test_feedback_shows_percent_of_roofline_and_says_emulated():
    res = JudgeResult(task_id="p2p/ipc_pull_copy", task_hash="x", mode="benchmark", world_size=2,
                      device_mode="cuda-shared", verdict=Verdict.passed,
                      roofline=Roofline(name="device copy bandwidth", gbps=2000.0, per_rank_gbps=1000.0, emulated=True),
                      benchmark=[_size(750.0, 75.0)])
    text = res.feedback()
    assert "roofline" in text and "75%" in text and "1000 GB/s per rank" in text and "emulated" in text
    nvlink = res.model_copy(update={"device_mode": "cuda", "roofline": Roofline(
        name="NVLink per direction (NVML)", gbps=478.0, per_rank_gbps=478.0, emulated=False)})
    assert "emulated" not in nvlink.feedback() and "NVLink" in nvlink.feedback()


def test_viewer_turns_carry_the_roofline():
    from pathlib import Path

    from commbench_env.trace.records import EpisodeStart, Trace, TraceAction, TraceStep

    jr = JudgeResult(task_id="p2p/ipc_pull_copy", task_hash="x", mode="benchmark", world_size=2,
                     device_mode="cuda", verdict=Verdict.passed,
                     roofline=Roofline(name="NVLink per direction (NVML)", gbps=478.0, per_rank_gbps=478.0,
                                       emulated=False), benchmark=[_size(239.0, 50.0)])
    trace = Trace(path=Path("t.jsonl"), start=EpisodeStart(task_id="p2p/ipc_pull_copy"),
                  steps=[TraceStep(turn=1, action=TraceAction(tool="benchmark"), judge_result=jr)])
    turn = episode_view(trace)["turns"][0]
    assert turn["benchmark"][0]["roofline_pct"] == 50.0 and turn["roofline"]["per_rank_gbps"] == 478.0


SMI_NVLINK = """GPU 0: NVIDIA H200 (UUID: GPU-0000)
\t Link 0: 26.562 GB/s
\t Link 1: 26.562 GB/s
\t Link 2: <inactive>
\t Link 3: 26.562 GB/s
"""


def test_nvlink_rate_from_nvidia_smi_text():
    assert roofline.parse_nvlink_status(SMI_NVLINK) == pytest.approx(3 * 26.562)
    assert roofline.parse_nvlink_status("GPU 0: NVIDIA H200\n\t Link 0: <inactive>\n") is None


def _percent_at_64mib(task_id: str, world: int, roof: Roofline) -> SizeResult:
    """The coordinator's statistics for one 64 MiB size whose calls all took 100 us on every rank."""
    import secrets

    from commbench_env.cards import load_task
    from commbench_env.judge.coordinator.evaluation import Evaluation
    from commbench_env.judge.host.request import JudgeRequest

    task = load_task(task_id)
    ev = Evaluation(JudgeRequest(task=task.judge_spec(), mode="benchmark", world_size=world,
                                 secret=secrets.token_bytes(32).hex(), workdir="/nonexistent"))
    ev.result.roofline = roof
    perf = ev.card.performance
    case = ev.op.size_case(perf, 64 << 20, world)
    return ev.size_result(case, 64 << 20, perf, [[100.0] * perf.iters for _ in range(world)], None)


SHARED = Roofline(name="device copy bandwidth", gbps=2000.0, per_rank_gbps=1000.0, emulated=True)


@pytest.mark.parametrize("world", [2, 4])
def test_in_cuda_shared_an_all_gather_is_measured_against_the_bytes_it_must_copy(world):
    # Each rank writes world blocks (its own too), busbw counts world - 1 of them: with all ranks on one GPU the
    # busbw a rank can reach is its copy share times (world - 1) / world, so the percentage is algbw's share.
    share = SHARED.model_copy(update={"per_rank_gbps": 2000.0 / world})
    s = _percent_at_64mib("collective/allgather_fullmesh", world, share)
    assert s.roofline_gbps == pytest.approx(2000.0 / world * (world - 1) / world)
    assert s.roofline_pct == pytest.approx(100 * s.algbw_gbps / (2000.0 / world))
    assert s.roofline_pct == pytest.approx(100 * s.busbw_gbps / s.roofline_gbps)


def test_the_own_block_changes_nothing_where_it_stays_off_the_links_or_is_not_copied():
    nvlink = Roofline(name="NVLink per direction (NVML)", gbps=478.0, per_rank_gbps=478.0, emulated=False)
    gather = _percent_at_64mib("collective/allgather_fullmesh", 2, nvlink)
    assert gather.roofline_gbps == 478.0 and gather.roofline_pct == pytest.approx(100 * gather.busbw_gbps / 478.0)
    push = _percent_at_64mib("p2p/ipc_push_copy", 2, SHARED)  # a copy to one peer: every byte written is a bus byte
    assert push.roofline_gbps == 1000.0 and push.roofline_pct == pytest.approx(100 * push.busbw_gbps / 1000.0)
    reduce = _percent_at_64mib("collective/reduce_scatter_mesh", 2, SHARED)
    assert reduce.roofline_gbps == 1000.0


def test_feedback_says_why_busbw_cannot_reach_the_whole_share():
    s = _percent_at_64mib("collective/allgather_fullmesh", 2, SHARED)
    res = JudgeResult(task_id="collective/allgather_fullmesh", task_hash="x", mode="benchmark", world_size=2,
                      device_mode="cuda-shared", verdict=Verdict.passed, roofline=SHARED, benchmark=[s])
    text = res.feedback()
    assert "1000 GB/s per rank" in text and "busbw can reach only 500 GB/s per rank" in text
    assert f"{s.roofline_pct:.0f}%" in text
