"""A check judges the code at more than one world size: code that works only at the episode's world (here, a
recursive doubling that needs a power of two) fails, and the feedback says at which world."""

from __future__ import annotations

import pytest

from commbench_env.cards import load_task
from commbench_env.episode import Episode
from commbench_env.judge.host.worlds import other_worlds

TASK = "collective/allreduce_ring"  # world sizes 2, 3, 4, 8; default 4

POWER_OF_TWO_ONLY = '''
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    acc, buf, d = x.clone(), torch.empty_like(x), 1
    while d < world:
        peer = rank ^ d
        if peer < world:
            for r in dist.batch_isend_irecv([dist.P2POp(dist.isend, acc, peer), dist.P2POp(dist.irecv, buf, peer)]):
                r.wait()
            acc += buf
        d <<= 1
    return acc
'''


@pytest.mark.parametrize("sizes,world,count,max_world,expected", [
    ([2, 3, 4, 8], 4, 1, None, [3]),          # a size that is not a power of two comes first
    ([2, 3, 4, 8], 3, 2, None, [2, 4]),       # then the nearest ones
    ([2, 4, 8], 2, 1, None, [4]),
    ([2, 4, 8], 8, 2, 4, [4, 2]),             # a `cuda` run leaves out worlds above the GPUs it has
    ([2], 2, 1, None, []),
    ([2, 3, 4], 2, 0, None, []),
])
def test_other_worlds_are_chosen_from_the_card(sizes, world, count, max_world, expected):
    assert other_worlds(sizes, world, count, max_world) == expected


def _check(source: str, trace_dir, **options):
    ep = Episode(task=TASK, max_turns=2, trace_dir=str(trace_dir), reference="none", **options)
    try:
        ep.start()
        return ep.step({"tool": "check", "source": source})
    finally:
        ep.close()


def test_code_right_only_at_the_episode_world_fails_and_says_where(tmp_path):
    out = _check(POWER_OF_TWO_ONLY, tmp_path)
    assert out.verdict == "wrong_answer" and not out.correct
    assert "correct at world 4, but wrong_answer at world 3" in out.feedback
    assert out.result.worlds[0].world == 3 and out.result.worlds[0].passed < out.result.worlds[0].total
    public = out.info()["judge_result"]
    assert all(c["name"].startswith("hidden #") for c in public["cases"] if not c["visible"])
    assert not any("world 3:" in c["name"] for c in public["cases"])  # other worlds' cases are hidden cases


def test_the_reference_passes_at_every_world_judged(tmp_path):
    out = _check(load_task(TASK).reference_source(), tmp_path)
    assert out.verdict == "pass" and out.correct and [w.world for w in out.result.worlds] == [3]
    assert "also correct at world 3" in out.feedback


def test_one_world_when_asked(tmp_path):
    out = _check(POWER_OF_TWO_ONLY, tmp_path, check_worlds=1)
    assert out.verdict == "pass" and out.result.worlds == []
