"""The Ray backend on a real one-node Ray instance kept on loopback (CPU tasks): evaluation episodes as Ray tasks,
the same records and traces as a local run, resource requests per device mode, sandbox actors for RL scoring."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from commbench_env.cards import load_task
from commbench_env.errors import CardError, CommBenchError
from commbench_env.run.evaluation import run_eval
from commbench_env.run.ray_backend import (EpisodeJob, RayOptions, RayScorer, RemoteEnv, agent_env_vars, episode_resources,
                                       pin_gpus, require_ray, run_episodes_ray)
from commbench_env.sandbox import load_profile
from commbench_env.run.scoring import Submission
from commbench_env.trace.records import read_trace

TASK = "p2p/ring_shift"


def test_missing_ray_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` does when it is not installed
    with pytest.raises(CommBenchError, match=r'pip install "commbench-env\[ray\]"'):
        require_ray()


def test_resources_follow_the_device_mode():
    assert episode_resources("local-cpu", 2) == {"num_cpus": 2.0, "num_gpus": 0.0}
    assert episode_resources("local-gpu", 4) == {"num_cpus": 4.0, "num_gpus": 4.0}  # one GPU per rank
    assert episode_resources("docker-gpu", 2, cpus=1) == {"num_cpus": 1.0, "num_gpus": 2.0}
    assert episode_resources("local-gpu-shared", 4) == {"num_cpus": 4.0, "num_gpus": 1.0}  # all ranks on one GPU
    assert episode_resources("local-gpu-shared", 4, gpu_share=0.5)["num_gpus"] == 0.5
    with pytest.raises(ValueError):
        episode_resources("local-gpu-shared", 2, gpu_share=0)


def test_sandbox_is_pinned_to_the_gpus_ray_gave():
    from commbench_env.sandbox.local import LocalSandbox

    gpu = pin_gpus(load_profile("local-gpu"), ["2", "3"])
    assert gpu.gpus.ids == [2, 3] and gpu.name == "local-gpu"
    sb = LocalSandbox(gpu)
    sb.start()
    try:
        assert sb._env(None)["CUDA_VISIBLE_DEVICES"] == "2,3"
    finally:
        sb.close()
    cpu = load_profile("local-cpu")
    assert pin_gpus(cpu, [0]) == cpu


def test_agent_key_is_forwarded_to_workers(monkeypatch):
    from commbench_env.agents import load_agent_card

    monkeypatch.setenv("ANTHROPIC_API_KEY", "k-test")
    assert agent_env_vars(load_agent_card("anthropic-claude")) == {"ANTHROPIC_API_KEY": "k-test"}
    assert agent_env_vars(load_agent_card("reference")) == {}


def test_cli_eval_on_ray(tmp_path):
    """`commbench eval --backend ray` as a user runs it: a one-node Ray instance on 127.0.0.1 of its own."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "commbench_env.cli", "eval", "--agent", "reference-submit", "--tasks",
                           TASK, "--world", "2", "--backend", "ray", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["key"], r["status"], r["verdict"]) for r in recs] == [(f"{TASK}#0", "done", "pass")]
    assert recs[0]["reward"] >= 0.5 and recs[0]["node"]["gpu_ids"] == []
    assert read_trace(recs[0]["trace_path"]).complete
    assert json.loads((out / "run.json").read_text())["backend"] == "ray"
    bad = subprocess.run([sys.executable, "-m", "commbench_env.cli", "eval", "--agent", "reference", "--tasks", TASK,
                          "--backend", "slurm", "--out", str(tmp_path / "x")], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "threads or ray" in bad.stderr


@pytest.fixture(scope="module")
def local_ray():
    from commbench_env.run.ray_backend import init_local_ray

    r = init_local_ray(num_cpus=2)
    assert {n["NodeManagerAddress"] for n in r.nodes()} == {"127.0.0.1"}
    yield r
    r.shutdown()


def _essentials(rec: dict) -> tuple:
    return rec["key"], rec["status"], rec["verdict"], rec["turns"], rec["correct"], rec["world_size"], rec["agent"]


def test_eval_on_ray_gives_the_local_records_and_traces(local_ray, tmp_path):
    task = load_task(TASK)
    local = run_eval("reference", [task], sandbox="local-cpu", out=tmp_path / "local", world=2)
    events: list[tuple[str, str]] = []
    remote = run_eval("reference", [task], sandbox="local-cpu", out=tmp_path / "ray", world=2, samples=2,
                      backend="ray", on_event=lambda kind, data: events.append((kind, data.get("key", ""))))
    assert [_essentials(r) for r in local] == [(f"{TASK}#0", "done", "pass", 3, True, 2, "reference")]
    by_key = {r["key"]: r for r in remote}
    assert sorted(by_key) == [f"{TASK}#0", f"{TASK}#1"]
    for rec in remote:
        assert (rec["status"], rec["verdict"], rec["turns"], rec["correct"]) == \
            (local[0]["status"], local[0]["verdict"], local[0]["turns"], local[0]["correct"])
        assert 0.5 <= rec["reward"] <= 1.0 and rec["node"]["host"]
        # the trace came back into the driver's run folder, complete, with the same turns as the local one
        path = rec["trace_path"]
        assert path.startswith(str(tmp_path / "ray" / "traces"))
        t, ref = read_trace(path), read_trace(local[0]["trace_path"])
        assert t.complete and t.task_id == TASK
        assert [s.action.tool for s in t.steps] == [s.action.tool for s in ref.steps]
        assert [s.verdict for s in t.steps] == [s.verdict for s in ref.steps]
    assert sorted(k for kind, k in events if kind == "done") == sorted(by_key)
    lines = (tmp_path / "ray" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2
    # re-running resumes: nothing left to play
    assert run_eval("reference", [task], sandbox="local-cpu", out=tmp_path / "ray", world=2, samples=2,
                    backend="ray") == []


def test_worker_with_another_card_version_stops_the_run(local_ray, tmp_path):
    job = EpisodeJob(task_id=TASK, world=2, task_hash="0000000000000000")
    with pytest.raises(CardError, match="same commbench-env version"):
        run_episodes_ray([job], trace_dir=tmp_path)


def test_episode_no_node_can_hold_is_refused(local_ray, tmp_path):
    with pytest.raises(CommBenchError, match="no node of the Ray cluster"):
        run_episodes_ray([EpisodeJob(task_id=TASK, sandbox="local-gpu", world=2)], trace_dir=tmp_path)
    with pytest.raises(CommBenchError, match="no node of the Ray cluster"):
        run_episodes_ray([EpisodeJob(task_id=TASK, world=2)], trace_dir=tmp_path,
                         options=RayOptions(cpus_per_episode=3))


def test_ray_scorer_judges_submissions_in_order(local_ray, tmp_path):
    ref = load_task(TASK).reference_source()
    with RayScorer("local-cpu", actors=2, world=2, cpus=1, trace_dir=str(tmp_path)) as scorer:
        assert len(scorer.nodes) == 2
        scores = scorer.score([Submission(TASK, "def ring_shift(x):\n    return (\n"), Submission(TASK, ref, 2),
                               Submission(TASK, "")])
    bad, good, empty = scores
    assert good.reward is not None and good.reward >= 0.5 and good.verdict == "pass" and good.correct
    assert bad.reward == 0.0 and bad.verdict == "compile_error" and "SyntaxError" in bad.feedback
    assert empty.reward == 0.0 and empty.verdict is None and "No source yet" in empty.feedback
    assert read_trace(good.trace_path).complete


def test_remote_env_plays_a_multi_turn_episode(local_ray, tmp_path):
    task = load_task(TASK)
    env = RemoteEnv("local-cpu", world=2, cpus=1, max_turns=3, trace_dir=str(tmp_path))
    try:
        obs, info = env.reset(options={"task": TASK, "world_size": 2})
        assert info["task_id"] == TASK and "def ring_shift" in obs["task"]
        obs, reward, term, trunc, info = env.step({"tool": "check", "source": task.starter})
        assert (reward, term, trunc) == (0.0, False, False) and info["verdict"] == "runtime_error"
        obs, reward, term, trunc, info = env.step({"tool": "submit", "source": task.reference_source()})
        assert term and info["verdict"] == "pass" and reward >= 0.5
    finally:
        env.close()
    env.close()  # idempotent


def test_trl_tool_env_on_a_ray_actor(local_ray, tmp_path):
    """CommBenchToolEnv(remote=True): the multi-turn TRL env with its sandbox in a Ray actor."""
    from commbench_env.integrations import task_rows
    from commbench_env.integrations.trl_adapter import CommBenchEpisodeReward, CommBenchToolEnv

    env = CommBenchToolEnv(max_turns=2, remote=True, world=2, trace_dir=str(tmp_path))
    try:
        env.reset(**task_rows(TASK, world_size=2, multi_turn=True)[0])
        assert "verdict: pass" in env.check(load_task(TASK).reference_source())
        rewards = CommBenchEpisodeReward()(prompts=["p"], completions=["c"], environments=[env])
        assert rewards[0] >= 0.5
    finally:
        env._drop_env()


def test_worker_that_dies_gives_an_infra_error_record(local_ray, tmp_path):
    """A worker process that dies mid-episode (here an agent that exits the process) is an infrastructure
    failure: an `infra_error` record and no trace, and the run goes on with the next episode."""
    from pathlib import Path

    from commbench_env.agents import AgentCard

    mod = tmp_path / "mods"
    mod.mkdir()
    (mod / "dying_agent.py").write_text(
        "import os\n\nclass DyingAgent:\n    name = 'dying'\n\n    def __init__(self, card):\n        pass\n\n"
        "    def reset(self, obs, info):\n        pass\n\n    def act(self, obs, info):\n        os._exit(3)\n\n"
        "    def close(self):\n        pass\n")
    root = Path(__file__).resolve().parent.parent
    opts = RayOptions(max_retries=0, env_vars={"PYTHONPATH": os.pathsep.join([str(mod), str(root)])})
    dying = AgentCard(name="dying", kind="dying_agent:DyingAgent", max_turns=2)
    jobs = [EpisodeJob(task_id=TASK, agent=dying, world=2, task_hash=load_task(TASK).hash),
            EpisodeJob(task_id=TASK, sample=1, agent="reference-submit", world=2)]
    recs = {r["key"]: r for r in run_episodes_ray(jobs, trace_dir=tmp_path / "traces", options=opts)}
    assert recs[f"{TASK}#0"]["status"] == "infra_error" and "WorkerCrashedError" in recs[f"{TASK}#0"]["error"]
    assert recs[f"{TASK}#1"]["status"] == "done" and recs[f"{TASK}#1"]["verdict"] == "pass"
    assert len(list((tmp_path / "traces").glob("*.jsonl"))) == 1
