"""The commbench command line, run as a user would run it (a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

from commbench_env.trace.records import read_trace


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commbench_env.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**__import__("os").environ, "COLUMNS": "200"})


def test_tasks_lists_and_filters():
    out = cli("tasks", "--json")
    assert out.returncode == 0, out.stderr
    tasks = json.loads(out.stdout)
    assert len(tasks) >= 16
    out = cli("tasks", "--json", "--category", "p2p")
    assert {t["category"] for t in json.loads(out.stdout)} == {"p2p"}
    out = cli("tasks", "--difficulty", "hard")
    assert out.returncode == 0 and "hard" in out.stdout


def test_show_prints_the_agent_view():
    out = cli("show", "collective/allreduce_ring")
    assert out.returncode == 0 and "def all_reduce" in out.stdout and "Visible cases" in out.stdout
    bad = cli("show", "nope/none")
    assert bad.returncode == 2 and "no task" in bad.stderr and "Traceback" not in bad.stderr


def test_judge_a_file(tmp_path):
    f = tmp_path / "solution.py"
    f.write_text("import torch\n\ndef ring_shift(x):\n    return x.clone()\n")
    out = cli("judge", "p2p/ring_shift", str(f), "--world", "2")
    assert out.returncode == 1 and "wrong_answer" in out.stdout and "rank" in out.stdout


def test_run_plays_episodes_and_writes_traces(tmp_path):
    out = cli("run", "--tasks", "p2p/ring_shift", "--world", "2", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr + out.stdout
    assert "summary" in out.stdout and "pass rate 1/1" in out.stdout
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert rows[0]["task_id"] == "p2p/ring_shift" and rows[0]["turns"] == 3 and rows[0]["reward"] > 0.5
    trace = read_trace(rows[0]["trace_path"])
    assert trace.complete
    shown = cli("trace", "show", rows[0]["trace_path"])
    assert shown.returncode == 0 and "turn 3: submit" in shown.stdout
    from commbench_env.run.evaluation import load_run_traces

    assert [t.task_id for t in load_run_traces(tmp_path)] == ["p2p/ring_shift"]  # the report counts the episode
    report = cli("report", str(tmp_path))
    assert report.returncode == 0 and "| 1 |" in (tmp_path / "report" / "report.md").read_text()


def test_unknown_agent_is_a_clear_error():
    out = cli("run", "--agent", "nobody")
    assert out.returncode == 2 and "no agent card" in out.stderr


def test_rows_for_verl_and_trl(tmp_path):
    import pandas as pd

    out = cli("rows", "--out", str(tmp_path / "train.parquet"), "--tasks", "p2p/ring_shift,collective/allreduce_ring",
              "--world", "2", "--repeats", "3")
    assert out.returncode == 0 and "6 rows (2 tasks) for verl" in out.stdout, out.stderr
    df = pd.read_parquet(tmp_path / "train.parquet")
    assert list(df["agent_name"]) == ["commbench"] * 6
    assert sorted({e["task"] for e in df["extra_info"]}) == ["collective/allreduce_ring", "p2p/ring_shift"]
    assert "def ring_shift" in df["prompt"][0][1]["content"] and "submit" in df["prompt"][0][0]["content"]
    out = cli("rows", "--trainer", "trl", "--out", str(tmp_path / "train.jsonl"), "--tasks", "p2p/ring_shift")
    (row,) = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert out.returncode == 0 and row["task"] == "p2p/ring_shift" and row["prompt"][0]["role"] == "system"
    bad = cli("rows", "--out", str(tmp_path / "x.parquet"), "--tasks", "p2p/ipc_push_copy")  # a CUDA task, cpu sandbox
    assert bad.returncode == 2 and "runs in sandbox 'local-cpu'" in bad.stderr and "Traceback" not in bad.stderr
