"""Calls whose clock ran on to a device-wide sync (work outlived the stop event): counted per size, told to the
agent, and absent from results written before the count existed. The count itself comes from the device host,
which needs a GPU (benchmarks/gpu_stream_checks.py and reward_stability.py print it there)."""

from __future__ import annotations

from commbench_env.judge.host.result import JudgeResult, SizeResult, Verdict


def _size(size: int, extended: int) -> SizeResult:
    return SizeResult(size_bytes=size, dtype="float32", count=size // 4, iters=20, warmup=5, time_us=100.0,
                      time_us_median=100.0, time_us_min=99.0, per_rank_mean_us=[100.0, 98.0], algbw_gbps=1.0,
                      busbw_gbps=1.0, extended_calls=extended)


def _result(*sizes: SizeResult) -> JudgeResult:
    return JudgeResult(task_id="p2p/ipc_push_copy", task_hash="x", mode="benchmark", world_size=2,
                       device_mode="cuda", verdict=Verdict.passed, benchmark=list(sizes))


def test_feedback_names_the_sizes_whose_clock_ran_to_a_device_sync():
    text = _result(_size(1 << 20, 0), _size(64 << 20, 7)).feedback()
    line = next(ln for ln in text.splitlines() if "device-wide sync" in ln)
    assert "7 calls at 67108864 B" in line and "1048576" not in line


def test_no_extension_no_line():
    assert "device-wide sync" not in _result(_size(1 << 20, 0)).feedback()


def test_results_from_before_the_count_load_as_zero():
    old = _size(1 << 20, 0).model_dump(mode="json")
    del old["extended_calls"]
    assert SizeResult.model_validate(old).extended_calls == 0


def test_the_hidden_work_rule_allows_for_host_noise_but_caps_it():
    from commbench_env.judge.candidate.device import HIDDEN_WORK_NS, HOST_NOISE_CAP_NS, work_outlived_call

    assert not work_outlived_call(HIDDEN_WORK_NS, 0)
    assert work_outlived_call(HIDDEN_WORK_NS + 1, 0)
    # an honest call's sync on a slow host: the idle sync at the call's start was slow too
    assert not work_outlived_call(60_000, 20_000)
    assert work_outlived_call(HIDDEN_WORK_NS + 20_001, 20_000)
    # background work queued before the call cannot buy an allowance beyond the cap
    huge = 10 * HOST_NOISE_CAP_NS
    assert work_outlived_call(HIDDEN_WORK_NS + HOST_NOISE_CAP_NS + 1, huge)


class _Timeline:
    """A GPU timeline in ms and a host clock in ns for RankDevice.timed_calls (no GPU here): each call's marks
    are 2 us apart, and a device sync takes `sync_ns` of host time, which the GPU clock also moves by."""

    def __init__(self, sync_ns: int):
        self.gpu_ms, self.host_ns, self.sync_ns = 0.0, 0, sync_ns

    def call(self) -> dict:
        self.gpu_ms += 0.002
        return {}

    def sync(self) -> None:
        self.host_ns += self.sync_ns
        self.gpu_ms += self.sync_ns / 1e6


def _rank_device(line: _Timeline, idle_sync_ns: int):
    from types import SimpleNamespace

    from commbench_env.judge.candidate.device import RankDevice

    dev = object.__new__(RankDevice)
    dev.device = SimpleNamespace(type="cuda")
    dev._event = lambda enable_timing=True: SimpleNamespace(t=None)
    dev._record = lambda ev: setattr(ev, "t", line.gpu_ms)
    dev._ev_sync = lambda ev: None
    dev._elapsed = lambda a, b: b.t - a.t
    dev._sync, dev._idle_sync_ns = line.sync, idle_sync_ns
    return dev


def test_torch_calls_whose_work_outlived_them_share_the_whole_window():
    """Async work never waited for (dist.all_reduce(x, async_op=True) without wait()) is ordered after none of the
    marks: each call's own span says nothing, so all of them get an equal share of the window up to the sync."""
    line = _Timeline(sync_ns=400_000)  # 0.4 ms of queued collectives still running after the last mark
    dev = _rank_device(line, idle_sync_ns=5_000)
    outs: list = []
    spans = dev.timed_calls([line.call] * 4, lambda: line.host_ns, lambda: None, outs)
    assert dev.extended and len(outs) == 4
    assert spans == [(8_000 + 400_000) // 4] * 4  # 4 x 2 us of marks plus the 400 us the sync waited


def test_torch_calls_with_an_honest_sync_keep_their_own_spans():
    line = _Timeline(sync_ns=30_000)  # within the allowance over an idle sync of 20 us
    dev = _rank_device(line, idle_sync_ns=20_000)
    spans = dev.timed_calls([line.call] * 3, lambda: line.host_ns, lambda: None, [])
    assert not dev.extended and spans == [2_000] * 3
