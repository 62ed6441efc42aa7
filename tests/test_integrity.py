"""integrity.snapshot: what candidate code changes in the harness's namespaces is put back and named, without the
check itself running candidate code. Runs in this process on the real modules (the settle puts them back)."""

from __future__ import annotations

import time

import torch

import commbench_env.judge.protocol as protocol
from commbench_env.judge.candidate import integrity


class _HostileKey:
    """A dict key that collides with a harness name and records every time it is compared or hashed."""

    calls = 0

    def __hash__(self) -> int:
        _HostileKey.calls += 1
        return hash("send_msg")

    def __eq__(self, other: object) -> bool:
        _HostileKey.calls += 1
        return False


def test_settle_puts_back_and_names_every_change():
    settle = integrity.snapshot()
    assert settle() == []
    real_send, real_clock, real_clone = protocol.send_msg, time.perf_counter_ns, torch.Tensor.clone
    protocol.send_msg = lambda *a, **k: None
    time.perf_counter_ns = lambda: 0
    torch.Tensor.clone = lambda self: self  # clone lives on the C base class: this adds a shadowing attribute
    vars(protocol)["len"] = lambda x: 0  # shadows a builtin for the harness's own code
    key = _HostileKey()
    vars(protocol)[key] = 1
    _HostileKey.calls = 0
    changed = settle()
    assert _HostileKey.calls == 0, "the check must never hash or compare a key it did not make"
    assert protocol.send_msg is real_send and time.perf_counter_ns is real_clock
    assert torch.Tensor.clone is real_clone and "clone" not in vars(torch.Tensor)
    assert "len" not in vars(protocol) and key not in list(vars(protocol))
    text = " ".join(changed)
    for what in ("commbench_env.judge.protocol.send_msg", "time.perf_counter_ns", "torch.Tensor.clone (added)",
                 "commbench_env.judge.protocol.len (added)", "not a string"):
        assert what in text, changed
    assert settle() == [], "after a settle the next one finds nothing"


def test_library_state_that_is_not_a_function_is_left_alone():
    settle = integrity.snapshot()
    torch.__dict__["_commbench_probe_flag"] = 3  # a plain value a library might cache at run time
    try:
        assert settle() == []
        assert torch.__dict__["_commbench_probe_flag"] == 3
    finally:
        del torch.__dict__["_commbench_probe_flag"]
        settle()
