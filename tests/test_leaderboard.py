"""The leaderboard file (`commbench report --json`): a tiny CPU eval played as a user plays it, then the JSON's
numbers against report.md's table, and the versions that make a row comparable, in the file and in the traces."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from commbench_env.run.leaderboard import COMPARABLE, task_set_hash
from commbench_env.trace.records import EpisodeStart, read_trace

TASKS = "p2p/ring_shift,collective/allreduce_ring"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commbench_env.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**__import__("os").environ, "COLUMNS": "200"})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("lb") / "run"
    res = cli("eval", "--agent", "reference-submit", "--tasks", TASKS, "--samples", "2", "--world", "2",
              "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    return out


def _table(md: str) -> dict[str, str]:
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    row = [c.strip() for c in lines[2].strip("|").split("|")]
    return dict(zip(head, row))


def test_json_numbers_equal_the_markdown_table(run_dir):
    res = cli("report", str(run_dir), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    board = json.loads((run_dir / "report" / "leaderboard.json").read_text())
    assert board["schema"] == "commbench-leaderboard/1"
    (entry,) = board["runs"]
    m, row = entry["metrics"], _table((run_dir / "report" / "report.md").read_text())
    assert row["agent"] == entry["agent"] == "reference-submit"
    assert int(row["episodes"]) == m["episodes"] == 4 and int(row["tasks"]) == m["tasks"] == 2
    for col, key in (("mean reward", "mean_reward"), ("pass rate", "pass_rate"), ("PASS+Good", "pass_good"),
                     ("GM speedup", "gm_speedup"), ("Pass x GM", "pass_x_gm")):
        assert row[col] == f"{m[key]:.3f}", col
    assert set(m["pass_at"]) == {"1", "2"}
    for k, v in m["pass_at"].items():
        assert row[f"pass@{k}"] == f"{v:.3f}"
    # per-task rows add up to the run's figures
    assert {t["task"] for t in entry["tasks"]} == set(TASKS.split(","))
    assert sum(t["passed"] for t in entry["tasks"]) / m["episodes"] == pytest.approx(m["pass_rate"])
    assert all(t["episodes"] == 2 and set(t["pass_at"]) == {"1", "2"} for t in entry["tasks"])
    assert entry["agent_card"]["name"] == "reference-submit"

    # stdout form: the same file, alone on stdout
    res = cli("report", str(run_dir), "--json-file", "-")
    assert res.returncode == 0 and json.loads(res.stdout)["runs"][0]["metrics"] == m


def test_versions_in_the_file_and_in_the_traces(run_dir):
    board = json.loads(cli("report", str(run_dir), "--json-file", "-").stdout)
    comp = board["runs"][0]["comparability"]
    assert set(COMPARABLE) <= set(comp) and comp["mixed"] == []
    assert comp["judge_version"] and comp["judge_source"] and comp["result_schema"]
    assert isinstance(comp["timing_version"], int) and comp["comm_model"].startswith("h200-nvswitch:")
    assert comp["hardware_fingerprint"] and comp["sandbox"] == "local-cpu" and comp["device_mode"] == "cpu"
    assert comp["image_digest"] == ""  # a local sandbox has no image
    assert comp["world_sizes"] == [2] and len(comp["comparable_key"]) == 16
    traces = [read_trace(p) for p in sorted((run_dir / "traces").glob("*.jsonl"))]
    assert comp["task_set_hash"] == task_set_hash({(t.task_id, t.start.task_hash) for t in traces})
    for t in traces:
        v = t.start.versions
        assert v.judge_version == comp["judge_version"] and v.timing_version == comp["timing_version"]
        assert v.hardware_fingerprint == comp["hardware_fingerprint"] and v.comm_model == comp["comm_model"]
        assert all(s.judge_result.judge_version == v.judge_version for s in t.steps if s.judge_result)


def test_old_traces_without_versions_still_load():
    old = {"type": "episode_start", "schema": "commbench-trace/1", "task_id": "p2p/ring_shift"}
    start = EpisodeStart.model_validate(old)
    assert start.versions.judge_version == "" and start.versions.timing_version is None


def test_a_task_on_its_own_fabric_records_that_link_model():
    """A card that names its link model (the host cluster) is timed on it, so its rows say so."""
    from commbench_env.cards import load_task
    from commbench_env.sandbox import load_profile
    from commbench_env.trace.versions import comm_model_id

    profile = load_profile("local-cpu")
    cluster = load_task("collective/allreduce_rabenseifner")
    assert comm_model_id(profile, cluster.link_model(profile.link_model)).startswith("host-posted-cluster:")
    ring = load_task("collective/allreduce_ring")
    assert comm_model_id(profile, ring.link_model(profile.link_model)) == comm_model_id(profile)
