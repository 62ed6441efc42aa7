"""Shared fixtures: one local sandbox with a warm judge for the whole session (as an RL loop would use it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("COMMBENCH_CACHE", str(Path(__file__).parent.parent / ".commbench" / "test-cache"))

from commbench_env.cards import Task, load_task  # noqa: E402
from commbench_env.judge.host.client import JudgeClient  # noqa: E402
from commbench_env.judge.host.result import JudgeResult  # noqa: E402
from commbench_env.sandbox import open_sandbox  # noqa: E402

TESTS = Path(__file__).parent
SUBMISSIONS = TESTS / "submissions"
ATTACKS = TESTS / "attacks"


@pytest.fixture(scope="session")
def judge():
    sb = open_sandbox("local-cpu")
    sb.start()
    client = JudgeClient(sb)
    yield client
    client.close()
    sb.close()


class Evaluate:
    """judge_files(task_id, source, mode, world, **kw) -> JudgeResult, through the shared sandbox."""

    def __init__(self, client: JudgeClient):
        self.client = client

    def __call__(self, task: str | Task, source: str | Path | None = None, mode: str = "check", world: int = 2,
                 **kw) -> JudgeResult:
        t = task if isinstance(task, Task) else load_task(task)
        if source is None:
            text = t.reference_source()
        elif isinstance(source, Path):
            text = source.read_text()
        else:
            text = source
        return self.client.evaluate(t, {t.card.entry.file: text}, mode, world, **kw)


@pytest.fixture(scope="session")
def evaluate(judge) -> Evaluate:
    return Evaluate(judge)


@pytest.fixture()
def trace_dir(tmp_path) -> Path:
    return tmp_path / "traces"
