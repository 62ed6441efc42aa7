"""A card can restrict which peers' buffers a rank reaches ([cuda] peer_groups): its group and its counterparts in
the other groups, so a two-level schedule is the only one the pointers allow. Checked on the argument block the
device host hands the candidate (built here from CPU tensors), on the card and on the statement."""

from __future__ import annotations

import pytest
import torch

from commbench_env.cards import CaseSpec, CudaSpec, Task, load_task
from commbench_env.judge.candidate.device_host import DeviceHost, peer_links


def test_a_rank_reaches_its_group_and_its_counterparts_only():
    assert peer_links(1, 8, 4) == [True, True, True, True, False, True, False, False]
    assert peer_links(6, 8, 2) == [True, False, True, False, True, False, True, True]
    assert peer_links(3, 4, 0) == [True] * 4  # no groups: every peer
    with pytest.raises(ValueError, match="does not divide world 6"):
        peer_links(0, 6, 4)


def _host(world: int, cuda: dict) -> DeviceHost:
    host = DeviceHost.__new__(DeviceHost)  # the argument builder only; the constructor wants a GPU
    host.world, host.devices, host.cuda = world, [0] * world, cuda
    return host


def test_the_argument_block_leaves_unlinked_peers_null():
    cuda = CudaSpec(input="x", output="y", params=["group"], peer_groups="group",
                    peer_buffers=["scratch", "flags"]).model_dump()
    bufs = [{"inputs": {"x": torch.zeros(4)}, "outs": {"y": torch.zeros(4)}, "scratch": torch.zeros(8, dtype=torch.uint8),
             "flags": torch.zeros(4, dtype=torch.int32)} for _ in range(4)]
    case = CaseSpec(name="c", shape=[4], dtype="float32", params={"group": 2})
    args = _host(4, cuda).args_for(case, bufs)
    a = args[1]
    assert a.params[0] == 2
    assert [bool(a.peer_scratch[p]) for p in range(4)] == [True, True, False, True]
    assert [bool(a.peer_flags[p]) for p in range(4)] == [True, True, False, True]
    assert [bool(a.peer_in[p]) for p in range(4)] == [False, True, False, False]  # private, and own only
    assert a.peer_scratch[3] == bufs[3]["scratch"].data_ptr()


def test_without_groups_every_shared_buffer_is_reachable():
    cuda = CudaSpec(input="x", output="y").model_dump()
    bufs = [{"inputs": {"x": torch.zeros(2)}, "outs": {"y": torch.zeros(2)}, "scratch": torch.zeros(8, dtype=torch.uint8),
             "flags": torch.zeros(4, dtype=torch.int32)} for _ in range(3)]
    args = _host(3, cuda).args_for(CaseSpec(name="c", shape=[2], dtype="float32"), bufs)
    assert all(args[0].peer_in[p] and args[0].peer_scratch[p] for p in range(3))


def test_the_group_size_must_reach_the_candidate():
    with pytest.raises(ValueError, match="must also be in \\[cuda\\] params"):
        CudaSpec(peer_groups="group")


def test_the_statement_states_the_groups():
    task = load_task("collective/allreduce_oneshot")
    cuda = task.card.cuda.model_copy(update={"params": [*task.card.cuda.params, "group"], "peer_groups": "group"})
    grouped = Task(task.card.model_copy(update={"cuda": cuda}), task.root)
    text = grouped.agent_view()
    assert "Ranks form groups of g = `args->params[" in text and "p % g == rank % g" in text
    assert "Ranks form groups" not in task.agent_view()
