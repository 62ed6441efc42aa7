"""`commbench export harbor`: Harbor task folders, run as their users run them. The agent's side (instruction.md,
task.toml, environment/) holds the public statement and starter only; the grading script (tests/test.sh) plays one
episode that submits the agent's file, here against the reference (a pass) and the starter (a fail); the check tool
judges the visible cases."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from commbench_env.cards import load_task
from commbench_env.paths import cards_root

TASKS = ["p2p/ring_shift", "collective/allreduce_ring"]
ENV = {**os.environ, "COLUMNS": "200", "COMMBENCH_PYTHON": sys.executable}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commbench_env.cli", *args], capture_output=True, text=True,
                          timeout=300, env=ENV)


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("harbor")
    res = cli("export", "harbor", str(out), "--tasks", ",".join(TASKS), "--world", "2")
    assert res.returncode == 0, res.stderr[-2000:]
    return out


def _agent_side(folder: Path) -> list[Path]:
    return [folder / "instruction.md", folder / "task.toml",
            *(p for p in (folder / "environment").rglob("*") if p.is_file())]


def test_layout(export):
    assert sorted(p.name for p in export.iterdir()) == ["collective__allreduce_ring", "p2p__ring_shift"]
    for task_id in TASKS:
        task, folder = load_task(task_id), export / task_id.replace("/", "__")
        files = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
        entry = task.card.entry.file
        assert {"instruction.md", "task.toml", "environment/Dockerfile", f"environment/app/{entry}",
                "environment/commbench/commbench-check", "environment/commbench/task/card.json",
                "environment/commbench/task/prompt.md", "tests/Dockerfile", "tests/test.sh",
                f"tests/task/{task_id}/task.toml", f"tests/task/{task_id}/reference.py"} <= files
        assert not any(f.startswith("solution/") for f in files)  # the oracle's solution only with --oracle
        cfg = tomllib.loads((folder / "task.toml").read_text())
        assert cfg["task"]["name"] == f"commbench/{task_id.replace('/', '-')}"
        assert cfg["verifier"]["environment_mode"] == "separate" and cfg["artifacts"] == [f"/app/{entry}"]
        assert cfg["metadata"]["commbench_task"] == task_id and cfg["metadata"]["commbench_task_hash"] == task.hash
        assert (folder / f"environment/app/{entry}").read_text() == task.starter
        assert os.access(folder / "tests/test.sh", os.X_OK)
        assert os.access(folder / "environment/commbench/commbench-check", os.X_OK)
        assert "_cards' / 'tasks'" in (folder / "environment/Dockerfile").read_text()  # bundled tasks removed


def test_instruction_is_what_commbench_show_prints(export):
    for task_id in TASKS:
        shown = cli("show", task_id)
        assert shown.returncode == 0
        text = (export / task_id.replace("/", "__") / "instruction.md").read_text()
        assert text.startswith(shown.stdout) and "commbench-check" in text[len(shown.stdout):]


def test_no_secret_on_the_agents_side(export):
    for task_id in TASKS:
        task, folder = load_task(task_id), export / task_id.replace("/", "__")
        view = task.agent_view()
        hidden = [c.name for c in task.card.cases if not c.visible]
        # names that are not ordinary words of the public statement must appear nowhere the agent can read
        secret_names = [n for n in hidden if n not in view]
        assert secret_names
        ref_lines = [ln.strip() for ln in task.reference_source().splitlines()
                     if len(ln.strip()) > 20 and ln.strip() not in view]
        assert ref_lines
        for path in _agent_side(folder):
            text = path.read_text()
            assert not [n for n in secret_names if n in text], path
            assert not [ln for ln in ref_lines if ln in text], path
        card = json.loads((folder / "environment/commbench/task/card.json").read_text())
        visible = {c.name for c in task.card.visible_cases()}
        assert {c["name"] for c in card["cases"]} <= visible | {f"{n}-public-variant" for n in visible}
        assert not (set(p.name for p in (folder / "environment").rglob("*")) & {"reference.py", "hints.md"})


def _grade(folder: Path, solution: Path, logs: Path) -> dict:
    res = subprocess.run(["bash", str(folder / "tests/test.sh")], capture_output=True, text=True, timeout=300,
                         env={**ENV, "COMMBENCH_SOLUTION": str(solution), "COMMBENCH_LOGS": str(logs)})
    assert res.returncode == 0, res.stderr[-2000:]
    return {**json.loads((logs / "result.json").read_text()), "reward_file": json.loads((logs / "reward.json").read_text())}


def test_grading_script_passes_the_reference_and_fails_the_starter(export, tmp_path):
    task, folder = load_task("p2p/ring_shift"), export / "p2p__ring_shift"
    ref = tmp_path / "reference.py"
    ref.write_text(task.reference_source())
    good = _grade(folder, ref, tmp_path / "logs-ref")
    assert good["verdict"] == "pass" and good["reward_file"] == {"reward": 1.0, "correct": 1.0}
    assert good["world_size"] == 2 and list((tmp_path / "logs-ref" / "traces").glob("*.jsonl"))
    bad = _grade(folder, folder / "environment/app/solution.py", tmp_path / "logs-starter")
    assert bad["verdict"] != "pass" and bad["reward_file"] == {"reward": 0.0, "correct": 0.0}


def test_check_tool_judges_the_visible_cases(export, tmp_path):
    task, folder = load_task("p2p/ring_shift"), export / "p2p__ring_shift"
    tool = folder / "environment/commbench/commbench-check"
    ref = tmp_path / "solution.py"
    ref.write_text(task.reference_source())
    # as in the agent's image: the package's cards without any task folder (the Dockerfile deletes them)
    home = tmp_path / "cards"
    shutil.copytree(cards_root() / "sandboxes", home / "sandboxes")
    env = {**ENV, "COMMBENCH_HOME": str(home)}
    ok = subprocess.run([str(tool), str(ref)], capture_output=True, text=True, timeout=300, env=env)
    assert ok.returncode == 0 and "verdict: pass" in ok.stdout, ok.stdout + ok.stderr
    names = {c.name for c in task.card.cases}
    assert {n for n in names if f"PASS {n}" in ok.stdout} == {c.name for c in task.card.visible_cases()}
    bad = subprocess.run([str(tool), str(folder / "environment/app/solution.py")], capture_output=True, text=True,
                         timeout=300, env=env)
    assert bad.returncode == 1 and "NotImplementedError" in bad.stdout
    missing = subprocess.run([str(tool), str(tmp_path / "nope.py")], capture_output=True, text=True, env=ENV)
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
