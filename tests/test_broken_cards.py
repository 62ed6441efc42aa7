"""One broken card never breaks unrelated tasks: it is listed as broken, with its file and what is wrong.

A copy of the card folders (COMMBENCH_HOME) with cards broken the ways users break them: binary bytes in a
task.toml, a negative benchmark size, a negative case shape, a non-ASCII prompt.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commbench_env.cards import broken_tasks, load_all_tasks, load_task, select_tasks
from commbench_env.errors import CardError
from commbench_env.paths import cards_root

def _in_performance(text: str, old: str, new: str) -> bytes:
    i = text.index("[performance]")
    return (text[:i] + text[i:].replace(old, new, 1)).encode()


BREAKS = {
    "collective/allreduce_ring": ("task.toml", lambda text: b"\xff\xfe\x00garbage" + text.encode()),
    "collective/alltoall_pairwise": ("task.toml", lambda text: _in_performance(text, "sizes = [", "sizes = [-4096, ")),
    "p2p/ring_shift": ("task.toml", lambda text: text.replace("shape = [", "shape = [-3, ", 1).encode()),
    "p2p/halo_exchange_1d": ("prompt.md", lambda text: ("Caf\u00e9 \u2014 " + text).encode()),
}
WHY = {"collective/allreduce_ring": "not UTF-8", "collective/alltoall_pairwise": "negative size",
       "p2p/ring_shift": "negative dimension", "p2p/halo_exchange_1d": "printable ASCII"}


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cards"
    for sub in ("tasks", "agents", "sandboxes", "dockerfiles"):
        if (cards_root() / sub).is_dir():
            shutil.copytree(cards_root() / sub, root / sub)
    for task_id, (name, broken) in BREAKS.items():
        path = root / "tasks" / task_id / name
        assert path.is_file(), f"{task_id} has no {name}"
        path.write_bytes(broken(path.read_text()))
    monkeypatch.setenv("COMMBENCH_HOME", str(root))
    from commbench_env import cards

    cards._all_task_dirs.cache_clear()
    yield root
    cards._all_task_dirs.cache_clear()


def test_broken_cards_are_listed_and_leave_the_others_usable(home):
    broken = broken_tasks()
    assert set(broken) == set(BREAKS)
    for task_id, why in broken.items():
        assert str(home / "tasks" / task_id) in why and WHY[task_id] in why, why
    ok = {t.id for t in load_all_tasks()}
    assert not ok & set(BREAKS) and "collective/reduce_scatter_ring" in ok
    collective = {t.id for t in select_tasks("collective")}
    assert "collective/allreduce_ring" not in collective and "collective/reduce_scatter_ring" in collective
    with pytest.raises(CardError, match="not UTF-8"):
        load_task("collective/allreduce_ring")  # named on its own, it says what is wrong
    with pytest.raises(CardError, match="not UTF-8"):
        select_tasks("collective/allreduce_ring")


def test_the_tasks_command_lists_broken_cards(home):
    env = {**os.environ, "COMMBENCH_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "commbench_env.cli", "tasks", "--json"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert {r["id"] for r in rows if "broken" in r} == set(BREAKS)
    assert sum("broken" not in r for r in rows) >= 20


def test_validate_names_the_broken_cards_its_selection_picks(home):
    env = {**os.environ, "COMMBENCH_HOME": str(home), "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "commbench_env.cli", "validate", "--tasks", "collective/allreduce_*"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr  # a broken card is a failure of the validation
    assert "broken card collective/allreduce_ring" in out.stderr and "not UTF-8" in out.stderr
    assert "p2p/ring_shift" not in out.stderr  # broken, but not in this selection
    assert "skipped collective/allreduce_oneshot" in out.stdout  # a CUDA task, on a CPU sandbox
