"""The judge's rooms (docs/trust-model.md): what runs in candidate processes never imports the trusted coordinator
or the host's side, and the host's side never imports what runs inside the sandbox."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import commbench_env

JUDGE = Path(commbench_env.__file__).parent / "judge"


def _judge_imports(source: str, room: str) -> set[str]:
    """The judge rooms (host, coordinator, candidate) that a module of `room` imports from."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        mod = node.module or ""
        if node.level == 0:
            if mod.startswith("commbench_env.judge."):
                found.add(mod.split(".")[2])
            continue
        if node.level == 1:
            target = room if room else mod.split(".")[0]
        elif node.level == 2 and room:
            target = mod.split(".")[0]
        else:
            continue
        found.update(n.name for n in node.names) if not mod and node.level == 2 else found.add(target)
    return found & {"host", "coordinator", "candidate"}


@pytest.mark.parametrize("room,never", [("candidate", {"coordinator", "host"}), ("host", {"coordinator", "candidate"})])
def test_a_room_never_imports_the_rooms_it_must_not_reach(room, never):
    paths = sorted((JUDGE / room).glob("*.py"))
    assert paths
    for path in paths:
        reached = _judge_imports(path.read_text(), room) & never
        assert not reached, f"{room}/{path.name} imports from {reached}"


@pytest.mark.parametrize("line", ["from ..coordinator.links import Links", "from ..coordinator import links",
                                  "from commbench_env.judge.coordinator.links import Links",
                                  "    from ..host.result import Verdict"])
def test_the_layout_check_sees_a_cross_room_import(line):
    source = (JUDGE / "candidate" / "rank.py").read_text()
    assert not _judge_imports(source, "candidate") & {"coordinator", "host"}
    body = f"def f():\n{line}\n" if line.startswith(" ") else line + "\n"
    assert _judge_imports(source + "\n" + body, "candidate") & {"coordinator", "host"}


def test_the_judge_process_does_not_import_gymnasium():
    code = ("import os, sys; os.environ['COMMBENCH_JUDGE_PROCESS'] = '1'; "
            "import commbench_env.judge.coordinator.server, commbench_env.judge.coordinator.evaluation; "
            "print('gymnasium' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    import gymnasium

    assert "CommBench-v0" in gymnasium.registry  # everywhere else the package registers its environment
