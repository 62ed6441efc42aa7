"""A prompt's rule is a judge's rule: integer results must be exact, and hidden cases with wide integer ranges
catch sums done in floating point (float64 included); a malformed int_range is a card error."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from commbench_env.cards import CaseSpec, load_task
from commbench_env.golden.base import generator, rand

FLOAT_SUM = '''
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    acc, buf = x.to(torch.float64), torch.empty_like(x)
    for step in range(1, world):
        dst, src = (rank + step) % world, (rank - step) % world
        for r in dist.batch_isend_irecv([dist.P2POp(dist.isend, x.contiguous(), dst),
                                         dist.P2POp(dist.irecv, buf, src)]):
            r.wait()
        acc = acc + buf.to(torch.float64)
    return acc.to(x.dtype)
'''


def test_integer_sums_in_floating_point_fail(evaluate):
    res = evaluate("collective/allreduce_ring", FLOAT_SUM, mode="check", world=4)
    failed = [c.name for c in res.cases if not c.passed]
    assert res.verdict.value == "wrong_answer" and failed == ["int64-wide"]
    assert evaluate("collective/allreduce_ring", None, mode="check", world=4).correct  # the reference is exact


def test_int_range_sets_the_drawn_values():
    case = CaseSpec(name="c", shape=[4096], dtype="int64", int_range=[-(1 << 59), 1 << 59])
    x = rand(case.shape, case.dtype, generator(1), low=case.int_range[0], high=case.int_range[1])
    assert int(x.abs().max()) > 1 << 55 and int(x.min()) >= -(1 << 59) and int(x.max()) < 1 << 59
    with pytest.raises(ValidationError, match="low < high"):
        CaseSpec(name="c", shape=[4], dtype="int64", int_range=[5, 5])


def test_the_wide_cases_are_hidden_cases_of_the_reduction_cards():
    for tid, name in (("collective/allreduce_ring", "int64-wide"), ("collective/reduce_scatter_ring", "int32-wide")):
        case = next(c for c in load_task(tid).card.cases if c.name == name)
        assert not case.visible and case.int_range
