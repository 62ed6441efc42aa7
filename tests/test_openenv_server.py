"""The OpenEnv door: a real server on 127.0.0.1 (uvicorn, OpenEnv's own HTTPEnvServer) and OpenEnv's own clients
playing whole episodes in `local-cpu`: rewards computed on the server, two sessions at once over one sandbox pool,
clear errors for bad actions, and nothing of the hidden cases on the wire."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="needs the openenv extra: pip install 'commbench-env[openenv]'")

import httpx  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

from commbench_env.cards import load_task  # noqa: E402
from commbench_env.integrations.openenv_server import (CommBenchAction, CommBenchClient,  # noqa: E402
                                                       ServerSettings, serve_in_thread)
from commbench_env.sandbox.pool import SandboxPool  # noqa: E402
from commbench_env.trace.records import read_trace  # noqa: E402

TASK = "p2p/ring_shift"
REFERENCE = load_task(TASK).reference_source()
# right on the visible shapes and on every hidden one but odd-length, where it is off by 0.5
WRONG_ON_ONE_HIDDEN = REFERENCE + '''

_right = ring_shift


def ring_shift(x):
    out = _right(x)
    return out + 0.5 if x.numel() == 4099 else out
'''


@pytest.fixture(scope="module")
def pool():
    with SandboxPool("local-cpu", max_sandboxes=2, acquire_timeout_s=60) as p:
        yield p


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("openenv-traces")


@pytest.fixture(scope="module")
def url(pool, traces):
    settings = ServerSettings(task=TASK, world_size=2, max_sessions=2, max_turns=4, trace_dir=str(traces))
    with serve_in_thread(settings, pool=pool) as base:
        yield base


def test_one_whole_episode_over_the_openenv_client(url):
    with CommBenchClient(base_url=url).sync() as env:
        first = env.reset(task=TASK, world_size=2, seed=3)
        obs = first.observation
        assert (first.reward, first.done) == (None, False)
        assert "def ring_shift" in obs.task and obs.feedback == "" and obs.turn == 0
        assert (obs.task_id, obs.world_size, obs.max_turns) == (TASK, 2, 4)
        assert obs.task_hash == load_task(TASK).hash and "submit" in obs.tools

        checked = env.step(CommBenchAction(tool="check", source=REFERENCE))
        obs = checked.observation
        assert (checked.reward, checked.done) == (0.0, False)  # intermediate turns earn 0 by default
        assert obs.verdict == "pass" and obs.tool == "check" and obs.turn == 1 and not obs.terminated
        assert obs.judge_result["verdict"] == "pass" and all(c["passed"] for c in obs.judge_result["cases"])
        assert obs.reward_parts["correct"] and obs.final_reward is None and "PASS" in obs.feedback

        submitted = env.step(CommBenchAction(tool="submit", metadata={"note": "the reference"}))  # reuses the code
        obs = submitted.observation
        assert submitted.done and obs.terminated and not obs.truncated and obs.verdict == "pass"
        assert 0.5 <= submitted.reward <= 1.0 and submitted.reward == obs.final_reward == obs.reward
        assert obs.reward_parts["correct"] and obs.reward_parts["speedup"] > 0
        assert obs.turn_rewards == [0.0, submitted.reward] and "Submitted. Reward" in obs.feedback

        state = env.state()
        assert (state.task_id, state.turn, state.step_count, state.done) == (TASK, 2, 2, True)
        assert state.final_reward == submitted.reward == state.episode_return and state.last_verdict == "pass"
        assert state.sandbox_profile == "local-cpu" and state.device_mode == "cpu" and state.episode_id

        with pytest.raises(RuntimeError, match="episode is over; call reset"):  # the session survives it
            env.step(CommBenchAction(tool="check"))
        again = env.reset(task=TASK)
        assert again.observation.turn == 0 and env.state().episode_id != state.episode_id


def test_two_sessions_at_once_each_with_its_own_episode_and_sandbox(url, pool):
    results: dict[int, tuple] = {}
    ready = threading.Barrier(2, timeout=60)

    def play(i: int) -> None:
        with CommBenchClient(base_url=url).sync() as env:
            env.reset(task=TASK, episode_id=f"session-{i}")
            ready.wait()  # both sessions hold their sandbox before either judges
            out = env.step({"tool": "check", "source": REFERENCE if i == 0 else "def ring_shift(x:\n"})
            results[i] = (out, env.state())

    threads = [threading.Thread(target=play, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [0, 1]
    (good, s0), (bad, s1) = results[0], results[1]
    assert (s0.episode_id, s1.episode_id) == ("session-0", "session-1")
    assert good.observation.verdict == "pass" and bad.observation.verdict == "compile_error"  # no crossed wires
    assert good.observation.sandbox["id"] != bad.observation.sandbox["id"]  # one pooled sandbox each
    deadline = time.monotonic() + 30
    while pool.stats().busy and time.monotonic() < deadline:  # closed sessions give their sandboxes back
        time.sleep(0.05)
    assert pool.stats().busy == 0 and pool.stats().live <= 2


def test_a_session_beyond_max_sessions_is_refused_with_a_clear_error(pool, traces):
    from websockets.sync.client import connect

    settings = ServerSettings(task=TASK, world_size=2, max_sessions=1, trace_dir=str(traces))
    with serve_in_thread(settings, pool=pool) as base, CommBenchClient(base_url=base).sync() as first:
        first.reset(task=TASK)  # holds the one session
        with connect(base.replace("http://", "ws://") + "/ws", open_timeout=30) as ws:
            refused = json.loads(ws.recv(timeout=30))
        assert refused["type"] == "error" and refused["data"]["code"] == "CAPACITY_REACHED"
        assert "1" in refused["data"]["message"] and refused["data"]["max_sessions"] == 1
        assert first.step(CommBenchAction(tool="check", source=REFERENCE)).observation.verdict == "pass"


def test_bad_actions_get_clear_errors_and_the_session_survives(url):
    with GenericEnvClient(base_url=url).sync() as env:  # plain dicts, as a consumer without our package sends
        with pytest.raises(RuntimeError, match="send reset first"):
            env.step({"tool": "check", "source": REFERENCE})
        with pytest.raises(RuntimeError, match=r"unknown reset options \['tsk'\]"):
            env.reset(tsk=TASK)
        with pytest.raises(RuntimeError, match="no task 'p2p/nope'|p2p/nope"):
            env.reset(task="p2p/nope")
        env.reset(task=TASK)
        for bad in ({"tool": "explode", "source": ""}, {"tool": "check", "code": "x"}, {"source": "x"}):
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
                env.step(bad)
        # an action of the right shape whose content is the agent's slip is an observation, as in Gymnasium
        empty = env.step({"tool": "check", "source": ""})
        assert "No source yet" in empty.observation["feedback"] and empty.reward == 0.0 and not empty.done
        ok = env.step({"tool": "check", "source": REFERENCE})
        assert ok.observation["verdict"] == "pass" and ok.observation["turn"] == 2
    with CommBenchClient(base_url=url).sync() as typed, pytest.raises(ValueError, match="tool"):
        typed.step({"tool": "explode"})  # the typed client checks before sending


def test_plain_http_endpoints_answer_json_never_a_500(url):
    with httpx.Client(base_url=url, timeout=60) as http:
        assert http.get("/health").json()["status"] == "healthy"
        schema = http.get("/schema").json()
        assert schema["action"]["properties"]["tool"]["enum"][:5] == ["compile", "check", "benchmark", "profile",
                                                                     "submit"]
        assert "judge_result" in schema["observation"]["properties"]
        assert http.get("/metadata").json()["name"] == "CommBench-Env"
        bad = http.post("/step", json={"action": {"tool": "explode"}})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "tool"
        stateless = http.post("/step", json={"action": {"tool": "check", "source": REFERENCE}})
        assert stateless.status_code == 409 and "send reset first" in stateless.json()["detail"]
        state = http.get("/state")  # stateless (a fresh env), in OpenEnv's base State
        assert state.status_code == 200 and state.json() == {"episode_id": None, "step_count": 0}


def test_hidden_cases_never_go_over_the_wire(url, traces):
    with GenericEnvClient(base_url=url).sync() as env:
        env.reset(task=TASK, episode_id="hidden-probe", agent={"name": "probe", "model": "none"})
        out = env.step({"tool": "check", "source": WRONG_ON_ONE_HIDDEN})
    wire = json.dumps(out.observation)
    assert out.observation["verdict"] == "wrong_answer" and "hidden #" in wire
    hidden = [c.name for c in load_task(TASK).card.cases if not c.visible]
    for name in hidden:
        assert name not in wire, f"hidden case {name!r} went over the wire"
    assert str(traces) not in wire and "trace_path" not in wire  # no path of the server's host either
    # the server's trace keeps the full result, values included: they existed, and stayed there
    trace = next(read_trace(p) for p in sorted(traces.rglob("*.jsonl"))
                 if read_trace(p).start.agent.get("episode_id") == "hidden-probe")
    assert trace.start.agent == {"client": "openenv", "episode_id": "hidden-probe", "name": "probe", "model": "none"}
    wrong = next(c for c in trace.steps[-1].judge_result.cases if c.name == "odd-length")
    assert wrong.mismatch.expected and wrong.mismatch.got
    assert wrong.mismatch.expected not in wire and wrong.mismatch.got not in wire


def test_commbench_serve_starts_a_server_that_answers(tmp_path):
    """The CLI as users run it: a free port, the URL printed, a health check and a schema over loopback."""
    cli = Path(sys.executable).with_name("commbench")
    proc = subprocess.Popen([str(cli), "serve", "--port", "0", "--max-sessions", "1", "--task", TASK,
                             "--trace-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "COLUMNS": "200"})
    try:
        line = proc.stdout.readline()
        assert "CommBench OpenEnv server on http://127.0.0.1:" in line, line + proc.stdout.read()
        base = line.split(" on ", 1)[1].split()[0]
        assert httpx.get(f"{base}/health", timeout=30).json()["status"] == "healthy"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_commbench_serve_names_a_wrong_task_and_a_busy_port_without_a_traceback():
    from typer.testing import CliRunner

    from commbench_env.cli import app
    from commbench_env.integrations.openenv_server import bind

    runner = CliRunner()
    bad_task = runner.invoke(app, ["serve", "--port", "0", "--task", "p2p/nope"])
    assert bad_task.exit_code == 2 and "no task 'p2p/nope'" in bad_task.output and "Traceback" not in bad_task.output
    with bind("127.0.0.1", 0) as taken:
        busy = runner.invoke(app, ["serve", "--port", str(taken.getsockname()[1]), "--task", TASK])
    assert busy.exit_code == 2 and "cannot listen on 127.0.0.1" in busy.output and "--port 0" in busy.output
    too_few = runner.invoke(app, ["serve", "--port", "0", "--max-sessions", "0"])
    assert too_few.exit_code == 2 and "max_sessions" in too_few.output


def test_without_the_extra_the_error_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv.core.client_types", None)  # as if openenv-core were not installed
    monkeypatch.delitem(sys.modules, "commbench_env.integrations.openenv_server")
    with pytest.raises(ImportError, match=r"pip install 'commbench-env\[openenv\]'"):
        import commbench_env.integrations.openenv_server  # noqa: F401


@pytest.mark.docker
def test_one_whole_episode_in_a_docker_sandbox(tmp_path):
    """The same door over the other sandbox kind CI has: the judge in a docker-cpu container."""
    from .sandbox_support import require_docker

    require_docker()
    settings = ServerSettings(sandbox="docker-cpu", task=TASK, world_size=2, max_sessions=1, max_turns=3,
                              trace_dir=str(tmp_path))
    with serve_in_thread(settings) as base, CommBenchClient(base_url=base).sync() as env:
        env.reset(task=TASK, world_size=2)
        submitted = env.step(CommBenchAction(tool="submit", source=REFERENCE))
        obs = submitted.observation
        assert submitted.done and obs.verdict == "pass" and 0.5 <= submitted.reward <= 1.0
        assert env.state().sandbox_profile == "docker-cpu"
