"""The inspect_ai task: inspect's mock model plays a whole episode through our tools on the CPU sandbox, the score is
our reward for it, and inspect's own log reader, `inspect log dump` and `inspect view` (on 127.0.0.1) read the log."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai", reason="pip install 'commbench-env[inspect]'")

from inspect_ai import eval as inspect_eval  # noqa: E402
from inspect_ai.log import read_eval_log  # noqa: E402
from inspect_ai.model import ModelOutput, ModelUsage, get_model  # noqa: E402

from commbench_env.cards import load_task  # noqa: E402
from commbench_env.episode.core import Episode  # noqa: E402
from commbench_env.errors import CommBenchError  # noqa: E402
from commbench_env.integrations.inspect import episode_tools, task_samples  # noqa: E402
from commbench_env.trace.records import read_trace  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TASK_FILE = ROOT / "commbench_env" / "integrations" / "inspect.py"
TASK = "p2p/ring_shift"
INSPECT = Path(sys.executable).with_name("inspect")
MOCK = "mockllm/model"


def _out(output: ModelOutput) -> ModelOutput:
    # usage set here: the mock model would otherwise count tokens with tiktoken, which downloads its vocabulary
    output.usage = ModelUsage(input_tokens=100, output_tokens=20, total_tokens=120)
    return output


def test_samples_are_what_commbench_show_prints():
    samples = task_samples(f"{TASK},collective/allreduce_ring", world_size=2)
    assert [s.id for s in samples] == [TASK, "collective/allreduce_ring"]
    for s in samples:
        assert s.input == load_task(s.id).agent_view()  # `commbench show <id>` prints agent_view()
        assert s.metadata["task_id"] == s.id and s.metadata["world_size"] == 2
    assert [s.id for s in task_samples([TASK])] == [TASK]  # -T tasks=[...] arrives as a YAML list
    with pytest.raises(CommBenchError, match="selects no task"):
        task_samples("no/such_task*")


def test_tools_are_the_episode_tools(tmp_path):
    episode = Episode(TASK, trace_dir=str(tmp_path))  # no sandbox starts before start()
    try:
        import anyio
        from inspect_ai.tool import ToolDef

        names = [ToolDef(t).name for t in episode_tools(episode, anyio.Lock())]
        assert names == ["compile", "check", "benchmark", "profile", "submit"]  # sanitize is for CUDA tasks only
        assert ToolDef(episode_tools(episode, anyio.Lock())[0]).parameters.required == ["source"]
    finally:
        episode.close()


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """One eval of the task file (loaded by path with task args, as `inspect eval FILE -T ...` does): the mock
    model checks the starter, replies once without a tool call, then submits the task's reference."""
    tmp = tmp_path_factory.mktemp("inspect")
    task = load_task(TASK)
    outputs = [_out(ModelOutput.for_tool_call(MOCK, "check", {"source": task.starter})),
               _out(ModelOutput.from_content(MOCK, "I will now think about the ring.")),
               _out(ModelOutput.for_tool_call(MOCK, "submit", {"source": task.reference_source()}))]
    cwd = os.getcwd()
    os.chdir(ROOT)  # inspect takes a task file relative to the working directory, as on its command line
    try:
        logs = inspect_eval(str(TASK_FILE.relative_to(ROOT)), task_args={"tasks": TASK, "world_size": 2, "max_turns": 4,
                                                                        "trace_dir": str(tmp / "traces")},
                            model=get_model(MOCK, custom_outputs=outputs), log_dir=str(tmp / "logs"), display="none")
    finally:
        os.chdir(cwd)
    return tmp, logs[0]


def test_mock_model_plays_a_whole_episode_and_scores_our_reward(played):
    _, log = played
    assert log.status == "success", log.error
    sample = log.samples[0]
    score = sample.scores["commbench_scorer"]
    meta = score.metadata
    trace = read_trace(meta["trace_path"])
    # the score is the reward the episode earned, as the trace (and so `commbench report`) records it
    assert trace.end is not None and trace.end.status == "finished"
    assert score.value == pytest.approx(trace.end.reward) and score.value >= 0.5
    assert meta["reward"] == score.value and meta["correct"] is True and meta["verdict"] == "pass"
    assert meta["speedup"] > 0 and meta["band"] in ("better", "on_par", "degraded", "severely_degraded")
    assert [s.action.tool for s in trace.steps] == ["check", None, "submit"] and meta["turns"] == 3
    assert trace.start.agent["name"] == f"inspect:{MOCK}" and trace.start.world_size == 2
    # what the model read: the judge's feedback through the tools, the env's parse help for the plain reply
    tool_results = [m.text for m in sample.messages if m.role == "tool"]
    assert "NotImplementedError" in tool_results[0]
    assert f"Submitted. Reward {score.value:.3f}" in tool_results[1]
    assert any(m.role == "user" and "Could not parse the action" in m.text for m in sample.messages)
    assert score.answer == load_task(TASK).reference_source()
    metrics = log.results.scores[0].metrics
    assert metrics["mean"].value == pytest.approx(score.value)
    assert metrics["pass_rate"].value == 1.0 and metrics["gm_speedup"].value == pytest.approx(meta["speedup"])
    assert metrics["pass_x_gm"].value == pytest.approx(meta["speedup"])


def test_inspect_reads_the_log_back(played):
    _, log = played
    again = read_eval_log(log.location)
    assert again.samples[0].scores["commbench_scorer"].value == log.samples[0].scores["commbench_scorer"].value
    proc = subprocess.run([str(INSPECT), "log", "dump", log.location], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dumped = json.loads(proc.stdout)
    assert dumped["eval"]["task_args"]["tasks"] == TASK
    assert dumped["samples"][0]["scores"]["commbench_scorer"]["metadata"]["correct"] is True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:  # 127.0.0.1 only
        return r.read()


def test_inspect_view_serves_the_log(played):
    tmp, log = played
    port = _free_port()
    view = subprocess.Popen([str(INSPECT), "view", "--log-dir", str(tmp / "logs"), "--host", "127.0.0.1",
                             "--port", str(port), "--display", "none"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "NO_COLOR": "1"})
    base = f"http://127.0.0.1:{port}/api"
    try:
        listing = None
        for _ in range(150):
            try:
                listing = json.loads(_get(f"{base}/log-files"))
                break
            except OSError:
                assert view.poll() is None, view.stderr.read().decode()[-3000:]
                time.sleep(0.2)
        assert listing is not None, "inspect view did not answer on 127.0.0.1"
        names = [f["name"] for f in listing["files"]]
        name = next(n for n in names if n.endswith(Path(log.location).name))
        served = json.loads(_get(f"{base}/logs/{urllib.parse.quote(name, safe='')}"))
        value = log.samples[0].scores["commbench_scorer"].value
        assert served["samples"][0]["scores"]["commbench_scorer"]["value"] == value
    finally:
        view.terminate()
        view.wait(timeout=30)


def test_a_missing_inspect_ai_is_a_clear_error():
    code = ("import sys; sys.modules['inspect_ai'] = None\n"
            "try:\n    import commbench_env.integrations.inspect\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "CommBenchError" in proc.stdout and "commbench-env[inspect]" in proc.stdout, proc.stdout + proc.stderr


def test_epochs_count_every_episode_in_the_anchor_metrics():
    """`--epochs N` plays a task N times: the reducer keeps every episode, so pass rate and GM speedup count them all
    (inspect's own reducers keep the first epoch's metadata only)."""
    from inspect_ai.scorer import SampleScore, Score

    from commbench_env.integrations.inspect import commbench_epochs, gm_speedup, pass_rate

    def episode(reward: float, correct: bool, speedup: float | None) -> Score:
        meta = {"task_id": TASK, "category": "p2p", "difficulty": "easy", "language": "torch", "agent": "m",
                "reward": reward, "correct": correct, "band": "on_par" if correct else None, "speedup": speedup,
                "turns": 2, "first_pass_turn": 2 if correct else None, "tokens_in": 0, "tokens_out": 0,
                "cost_usd": 0.0, "hints": False}
        return Score(value=reward, metadata=meta)

    reduced = commbench_epochs()([episode(1.0, True, 2.0), episode(0.0, False, None), episode(0.8, True, 0.5)])
    assert reduced.value == pytest.approx(0.6) and len(reduced.metadata["epochs"]) == 3
    scores = [SampleScore(score=reduced, sample_id=TASK)]
    assert pass_rate()(scores) == pytest.approx(2 / 3)
    assert gm_speedup()(scores) == pytest.approx(1.0)  # geometric mean of 2.0 and 0.5 over the passing episodes
    unscored = [SampleScore(score=Score(value=0.0, metadata={"status": "not played"}), sample_id=TASK)]
    assert math.isnan(pass_rate()(unscored))
