"""A deadlock costs one case's limit, not the evaluation's, and its feedback shows where each hung rank waits in
the candidate's own code (with the line), never the judge's frames or the host's paths."""

from __future__ import annotations

import time

from commbench_env.cards import load_task
from commbench_env.judge.coordinator.stacks import candidate_stack
from commbench_env.judge.host.result import Verdict

DEADLOCK = '''import torch
import torch.distributed as dist


def ring_shift(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    buf = torch.empty_like(x)
    dist.recv(buf, (rank - 1) % world)
    dist.send(x.contiguous(), (rank + 1) % world)
    return buf
'''

DUMP = '''Thread 0x00007f57037fe6c0 (most recent call first):
  File "/opt/pkg/commbench_env/judge/candidate/guard.py", line 161 in timed
  File "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", line 2799 in recv
  File "/usr/lib/python3/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/opt/pkg/commbench_env/judge/candidate/guard.py", line 161 in timed
  File "solution.py", line 8 in ring_shift
  File "solution.py", line HELPER in helper
  File "/opt/pkg/commbench_env/judge/candidate/candidate_thread.py", line 90 in run

Current thread 0x00007f572d04cb80 (most recent call first):
  File "/opt/pkg/commbench_env/judge/candidate/rank.py", line 211 in _timed_calls
'''


def test_the_stack_keeps_the_candidates_frames_with_their_lines():
    src = DEADLOCK + "\n\ndef helper(x):\n    return ring_shift(x)\n"
    line = src.splitlines().index("    return ring_shift(x)") + 1
    text = candidate_stack(DUMP.replace("HELPER", str(line)), "solution.py", "/opt/pkg/commbench_env", src)
    lines = text.splitlines()
    assert lines[0] == "thread 1 (most recent call last):"
    assert lines[1:5] == [f"  solution.py, line {line}, in helper", "    return ring_shift(x)",
                          "  solution.py, line 8, in ring_shift", "    dist.recv(buf, (rank - 1) % world)"]
    assert lines[5] == "  waiting in recv (torch/distributed/distributed_c10d.py, line 2799)"
    assert "commbench_env" not in text and "/usr/lib" not in text and len(lines) == 6


def test_a_stack_outside_candidate_code_says_so():
    assert "no thread was running your code" in candidate_stack(DUMP.split("\n\n")[1], "solution.py", "/opt/pkg")


def test_a_deadlock_ends_at_the_case_limit_and_names_the_line(evaluate, tmp_path):
    task = load_task("p2p/ring_shift")
    limit = task.card.limits.case_limit_s
    assert limit < task.card.limits.timeout_s / 2
    path = tmp_path / "solution.py"
    path.write_text(DEADLOCK)
    t0 = time.monotonic()
    res = evaluate("p2p/ring_shift", path, mode="check", world=2)
    assert time.monotonic() - t0 < limit + 10
    assert res.verdict == Verdict.timeout and f"a case's time limit of {limit:g}s" in res.summary
    text = res.feedback()
    assert "dist.recv(buf, (rank - 1) % world)" in text and "waiting in recv" in text
    assert "commbench_env" not in text and "guard.py" not in text
