"""A CUDA task's profile split per rank: every rank's kernels run in one process, and the device host tells them
apart by the stream (and GPU) they ran on, found from a marker it launches on each rank's stream.

The profiler's kernel records need a GPU (benchmarks/gpu_feedback_demo.py shows the split there); here they are
written by hand, as `kernel_table.kernel_records` reads them from `torch.profiler`."""

from __future__ import annotations

from commbench_env.judge.candidate.kernel_table import MARKER, KernelRecord, rank_streams, table, tables_by_rank
from commbench_env.judge.host.result import JudgeResult, RankProfile, Verdict

# cuda-shared, world 3: every rank on GPU 0, rank streams 13, 14, 15 (CUPTI's ids are not in rank order)
SHARED = [KernelRecord(MARKER, 0, 14, start_us=1.0, us=20.0, order=101),  # rank 1: two units
          KernelRecord(MARKER, 0, 15, start_us=1.5, us=30.0, order=102),  # rank 2: three
          KernelRecord(MARKER, 0, 13, start_us=0.5, us=10.0, order=100),  # rank 0: one
          KernelRecord("pull_kernel", 0, 13, start_us=50.0, us=7.0),
          KernelRecord("pull_kernel", 0, 14, start_us=50.0, us=9.0),
          KernelRecord("pull_kernel", 0, 14, start_us=60.0, us=3.0),
          KernelRecord("tail_kernel", 0, 15, start_us=50.0, us=1.0)]


def test_each_kernel_goes_to_the_rank_whose_stream_it_ran_on():
    assert rank_streams(SHARED, 3) == {(0, 13): 0, (0, 14): 1, (0, 15): 2}
    tables = tables_by_rank(SHARED, [0, 0, 0])
    assert [[(r["name"], r["calls"], r["total_us"]) for r in t] for t in tables] == [
        [("pull_kernel", 1, 7.0)], [("pull_kernel", 2, 12.0)], [("tail_kernel", 1, 1.0)]]
    assert tables[1][0]["mean_us"] == 6.0


def test_the_table_of_all_ranks_leaves_the_markers_out():
    assert [(r["name"], r["calls"]) for r in table(SHARED)] == [("pull_kernel", 3), ("tail_kernel", 1)]


def test_no_split_where_a_kernel_ran_on_a_stream_the_judge_did_not_make_on_a_shared_gpu():
    side = [*SHARED, KernelRecord("side_kernel", 0, 99, start_us=55.0, us=2.0)]
    assert tables_by_rank(side, [0, 0, 0]) is None


def test_in_cuda_mode_a_side_stream_belongs_to_its_gpu_rank():
    recs = [KernelRecord(MARKER, 0, 7, 0.0, 10.0, order=1), KernelRecord(MARKER, 1, 7, 0.1, 20.0, order=2),
            KernelRecord("push", 1, 7, 5.0, 4.0), KernelRecord("push_side", 1, 22, 5.0, 2.0)]
    tables = tables_by_rank(recs, [0, 1])
    assert tables[0] == [] and [r["name"] for r in tables[1]] == ["push", "push_side"]


def test_markers_that_are_missing_share_a_stream_or_disagree_with_launch_order_give_no_split():
    assert rank_streams(SHARED[:2], 3) is None
    same = [KernelRecord(MARKER, 0, 13, 0.0, 10.0, order=1), KernelRecord(MARKER, 0, 13, 0.1, 20.0, order=2)]
    assert rank_streams(same, 2) is None
    swapped = [KernelRecord(MARKER, 0, 13, 0.0, 20.0, order=1), KernelRecord(MARKER, 0, 14, 0.1, 10.0, order=2)]
    assert rank_streams(swapped, 2) is None


def test_a_later_sleep_on_the_gate_is_not_taken_for_a_marker():
    gate = KernelRecord(MARKER, 0, 3, start_us=40.0, us=5.0, order=200)  # the start gate's fallback sleep
    assert rank_streams([*SHARED, gate], 3) == {(0, 13): 0, (0, 14): 1, (0, 15): 2}


def test_feedback_gives_each_rank_its_own_kernels():
    tables = tables_by_rank(SHARED, [0, 0, 0])
    profile = [RankProfile(rank=r, case="v", wall_us=100 + r, comm_us=0, compute_us=100 + r, rows=t,
                           rows_of_own_kernels=True) for r, t in enumerate(tables)]
    text = JudgeResult(task_id="p2p/ipc_pull_copy", task_hash="x", mode="profile", world_size=3,
                       device_mode="cuda-shared", verdict=Verdict.passed, profile=profile).feedback()
    assert "rank 1: wall 101 us, its kernels:" in text and "every rank" not in text
    rank2 = text[text.index("rank 2:"):]
    assert "tail_kernel" in rank2 and "pull_kernel" not in rank2
