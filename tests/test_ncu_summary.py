"""Nsight Compute feedback: which kernel `ncu -k` is pointed at, and what of its report reaches the agent.

ncu itself needs a GPU (see benchmarks/gpu_validate.py); its text format is fixed by NVIDIA's details page.
"""

from __future__ import annotations

import pytest

from commbench_env.judge.coordinator.cuda_tools import NCU_METRICS, kernel_base_name, summarise_ncu
from commbench_env.judge.host.result import JudgeResult, SanitizerReport, Verdict


@pytest.mark.parametrize("profiler_name,base", [
    ("void (anonymous namespace)::pull_kernel(char*, char const*, long)", "pull_kernel"),
    ("void (anonymous namespace)::fused_kernel<float, 4, true, true>(FusedArgs)", "fused_kernel"),
    ("[gpu] ring_kernel", "ring_kernel"),
    ("void ns::inner::push<16>(char*)", "push"),
])
def test_kernel_base_name_is_what_ncu_matches(profiler_name, base):
    assert kernel_base_name(profiler_name) == base


DETAILS = """==PROF== Connected to process 4242
==PROF== Profiling "pull_kernel": 0%....50%....100% - 9 passes
  pull_kernel(char *, const char *, long) (264, 1, 1)x(512, 1, 1), Context 1, Stream 13, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    DRAM Frequency                  Ghz         3.20
    Memory Throughput                 %        88.02
    DRAM Throughput                   %        88.02
    Duration                         us        62.14
    Compute (SM) Throughput           %        12.50
    OPT   This kernel exhibits low compute throughput relative to the peak performance of this device.
    Section: Occupancy
    Achieved Occupancy                %        45.10
    WRN   One or more blocks were limited by registers.
          On average, each warp of this kernel spends 9.1 cycles being stalled waiting for a scoreboard dependency
    INF   an informational line that is left out
"""


def test_summary_keeps_the_kernel_the_figures_and_the_findings():
    text = summarise_ncu(DETAILS, NCU_METRICS)
    lines = text.splitlines()
    assert lines[0].startswith("pull_kernel(") and "Device 0" in lines[0]
    assert "  DRAM Throughput % 88.02" in lines and "  Achieved Occupancy % 45.10" in lines
    assert any("Duration us 62.14" in ln for ln in lines)
    assert any(ln.startswith("  OPT") for ln in lines) and any(ln.startswith("  WRN") for ln in lines)
    assert any("being stalled waiting for a scoreboard" in ln for ln in lines)
    assert "DRAM Frequency" not in text and "==PROF==" not in text and "INF" not in text


def test_feedback_shows_the_ncu_summary():
    res = JudgeResult(task_id="p2p/ipc_pull_copy", task_hash="x", mode="profile", world_size=2, device_mode="cuda",
                      verdict=Verdict.passed, ncu=SanitizerReport(tool="ncu", status="ok", report="  DRAM Throughput % 88.02"))
    assert "Nsight Compute (ok):" in res.feedback() and "DRAM Throughput % 88.02" in res.feedback()


def test_kernel_rows_get_the_bandwidth_of_the_ops_bytes():
    from commbench_env.judge.host.result import RankProfile, kernel_bandwidth

    rows = [{"name": "[gpu] ncclDevKernel_AllReduce", "kind": "comm", "calls": 2, "total_us": 200.0, "mean_us": 100.0},
            {"name": "aten::add_", "kind": "compute", "calls": 1, "total_us": 5.0, "mean_us": 5.0}]
    torch_rows = kernel_bandwidth(rows, 64 << 20, gpu_rows_only=True)  # torch ranks: only the GPU kernels
    assert torch_rows[0]["gbps"] == pytest.approx((64 << 20) / 100e-6 / 1e9) and "gbps" not in torch_rows[1]
    assert all("gbps" in r for r in kernel_bandwidth(rows, 1 << 20, gpu_rows_only=False))  # cuda tasks: all rows
    assert "gbps" not in kernel_bandwidth(rows, 0, gpu_rows_only=False)[0]  # no bytes known: no figure
    res = JudgeResult(task_id="p2p/ipc_pull_copy", task_hash="x", mode="profile", world_size=2, device_mode="cuda",
                      verdict=Verdict.passed, profile=[RankProfile(rank=0, case="v", wall_us=100, comm_us=100,
                                                                   compute_us=0, rows=torch_rows)])
    assert "671.1 GB/s" in res.feedback()


def test_cuda_profile_says_its_kernel_table_holds_every_rank():
    """CUDA ranks share one process: the one kernel table is shown with rank 0 and says so."""
    from commbench_env.judge.host.result import RankProfile

    rows = [{"name": "pull_kernel", "kind": "compute", "calls": 2, "total_us": 20.0, "mean_us": 10.0}]
    profile = [RankProfile(rank=0, case="v", wall_us=105, comm_us=0, compute_us=105, rows=rows, rows_of_all_ranks=True),
               RankProfile(rank=1, case="v", wall_us=104, comm_us=0, compute_us=104)]
    text = JudgeResult(task_id="p2p/ipc_pull_copy", task_hash="x", mode="profile", world_size=2, device_mode="cuda",
                       verdict=Verdict.passed, profile=profile).feedback()
    assert "rank 0: wall 105 us (the kernels of every rank, which share one process:)" in text
    assert "rank 1: wall 104 us\n" in text + "\n" and "torch.distributed" not in text
    assert "pull_kernel" in text
