"""LLM agents end to end: the real openai / anthropic SDKs talk to real HTTP servers on 127.0.0.1 that speak each
provider's wire protocol (tests/fake_providers.py), and play full episodes through the real env and judge.

"openai" is the OpenAI agent on Chat Completions, "openai-responses" the same agent with api = "responses"."""

from __future__ import annotations

import json
import time

import pytest

from commbench_env.agents import load_agent
from commbench_env.agents.base import AgentCard, load_agent_card
from commbench_env.agents.llm import AgentError, Reply, Turn, parse_text_reply
from commbench_env.cards import load_task
from commbench_env.episode.gym_env import CommBenchEnv
from commbench_env.errors import CardError
from commbench_env.run.runner import play_episode
from commbench_env.trace.records import read_trace

from .fake_providers import (FakeProvider, anthropic_error, anthropic_refusal, anthropic_text, anthropic_tool_use,
                             openai_error, openai_refusal, openai_text, openai_tool_call, responses_refusal,
                             responses_text, responses_tool_call)

TASK = "p2p/ring_shift"
KEY_ENV = "COMMBENCH_FAKE_LLM_KEY"
PROVIDERS = ["openai", "openai-responses", "anthropic"]
KIND = {"openai": "openai", "openai-responses": "openai", "anthropic": "anthropic"}  # agent kind = fake server
API = {"openai-responses": {"api": "responses"}}
PATH = {"openai": "/v1/chat/completions", "openai-responses": "/v1/responses", "anthropic": "/v1/messages"}
TOOL = {"openai": openai_tool_call, "openai-responses": responses_tool_call, "anthropic": anthropic_tool_use}
TEXT = {"openai": openai_text, "openai-responses": responses_text, "anthropic": anthropic_text}
REFUSAL = {"openai": openai_refusal, "openai-responses": responses_refusal, "anthropic": anthropic_refusal}
ERROR = {"openai": openai_error, "openai-responses": openai_error, "anthropic": anthropic_error}
BROKEN = "import torch\nimport torch.distributed as dist\n\ndef ring_shift(x):\n    return x.clone(\n"


@pytest.fixture(scope="module")
def reference_source() -> str:
    return load_task(TASK).reference_source()


@pytest.fixture()
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-fake-test-key")


def fake_server(provider: str) -> FakeProvider:
    return FakeProvider(KIND[provider])


def make_agent(provider: str, fake: FakeProvider, **params):
    p = {"model": f"fake-{provider}-model", "base_url": fake.base_url, "api_key_env": KEY_ENV,
         "retry_min_wait_s": 0.05, "retry_max_wait_s": 0.2, "max_retries": 3, "timeout_s": 30,
         "price_per_mtok_input": 2.0, "price_per_mtok_output": 10.0, **API.get(provider, {}), **params}
    return load_agent(AgentCard(name=f"test-{provider}", kind=KIND[provider], params=p))


def play(provider: str, fake: FakeProvider, trace_dir, **params):
    env = CommBenchEnv(task=TASK, sandbox="local-cpu", world_size=2, max_turns=4, trace_dir=str(trace_dir))
    agent = make_agent(provider, fake, **params)
    try:
        summary = play_episode(env, agent)
    finally:
        agent.close()
        env.close()
    return summary, read_trace(summary.trace_path)


def request_text(body) -> str:
    """Everything a request sent to the model, as one string."""
    return json.dumps(body)


# -- (a) a full episode: broken compile, fixed check, submit -------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
def test_episode_fix_then_submit(provider, key, trace_dir, reference_source):
    with fake_server(provider) as fake:
        fake.add(TOOL[provider]("compile", BROKEN, text="First try."),
                 TOOL[provider]("check", reference_source, tokens_in=2000, tokens_out=300),
                 TOOL[provider]("submit", ""))
        fake_reply_call_ids = [next(i["call_id"] for i in r.body.get("output", []) if i["type"] == "function_call")
                               for r in fake.script[:2]] if provider == "openai-responses" else []
        summary, trace = play(provider, fake, trace_dir)
    assert [s.verdict for s in trace.steps] == ["compile_error", "pass", "pass"]
    assert [s.action.tool for s in trace.steps] == ["compile", "check", "submit"]
    assert summary.reward > 0.5 and summary.correct
    m1, m2 = trace.steps[0].meta.model_dump(), trace.steps[1].meta.model_dump()
    assert m1["model"] == f"fake-{provider}-model" and m1["message"] == "First try."
    assert (m1["tokens_in"], m1["tokens_out"]) == (1000, 200)
    assert m1["cost_usd"] == pytest.approx((1000 * 2.0 + 200 * 10.0) / 1e6)
    assert (m2["tokens_in"], m2["tokens_out"]) == (2000, 300)
    # the wire: three requests, tools declared, the system prompt sent, judge feedback returned as the tool result
    assert len(fake.requests) == 3
    assert all(r.path == PATH[provider] for r in fake.requests)
    first, second = fake.requests[0].body, fake.requests[1].body
    if provider == "openai-responses":
        assert fake.requests[0].headers.get("authorization") == "Bearer sk-fake-test-key"
        # flat function tools, the system prompt as instructions, stateless, the completion budget
        assert {t["name"] for t in first["tools"]} == {"compile", "check", "benchmark", "profile", "submit",
                                                      "sanitize"}
        assert all(t["type"] == "function" and "function" not in t and t["parameters"]["required"] == ["source"]
                   for t in first["tools"])
        assert "submit" in first["instructions"] and first["store"] is False and first["max_output_tokens"] > 0
        assert "messages" not in first and "max_tokens" not in first
        assert first["input"][0]["role"] == "user" and "ring_shift" in first["input"][0]["content"]
        assert len(first["input"]) == 1
        # turn 2: user, the assistant text, the function call, its output carrying the judge feedback
        items = second["input"]
        assert items[1] == {"role": "assistant", "content": "First try."}
        call, out = items[2], items[3]
        assert call["type"] == "function_call" and call["name"] == "compile"
        assert json.loads(call["arguments"]) == {"source": BROKEN}
        first_call_id = fake_reply_call_ids[0]
        assert call["call_id"] == first_call_id
        assert out["type"] == "function_call_output" and out["call_id"] == first_call_id
        feedback = out["output"]
        # turn 3 replays both earlier calls, each followed by its output
        third = fake.requests[2].body["input"]
        assert [i.get("type", i.get("role")) for i in third] == ["user", "assistant", "function_call",
                                                                 "function_call_output", "function_call",
                                                                 "function_call_output"]
        assert third[4]["call_id"] == third[5]["call_id"] == fake_reply_call_ids[1]
        assert third[5]["output"] == trace.steps[1].observation
    elif provider == "openai":
        assert fake.requests[0].headers.get("authorization") == "Bearer sk-fake-test-key"
        assert {t["function"]["name"] for t in first["tools"]} == {"compile", "check", "benchmark", "profile",
                                                                  "submit", "sanitize"}
        assert first["messages"][0]["role"] == "system" and "ring_shift" in first["messages"][1]["content"]
        tool_msg = second["messages"][3]
        assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == second["messages"][2]["tool_calls"][0]["id"]
        feedback = tool_msg["content"]
    else:
        h = fake.requests[0].headers  # this SDK version sends the key as x-api-key or as a bearer token
        assert "sk-fake-test-key" in (h.get("x-api-key", ""), h.get("authorization", "").removeprefix("Bearer "))
        assert {t["name"] for t in first["tools"]} == {"compile", "check", "benchmark", "profile", "submit",
                                                       "sanitize"}
        assert "submit" in first["system"] and first["max_tokens"] > 0
        block = second["messages"][2]["content"][0]
        assert block["type"] == "tool_result"
        assert block["tool_use_id"] == second["messages"][1]["content"][1]["id"]
        feedback = block["content"]
    assert feedback == trace.steps[0].observation  # the judge's feedback, verbatim
    assert "compile" in feedback.lower()


# -- (b) 429 with Retry-After ---------------------------------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
def test_rate_limit_honours_retry_after(provider, key, trace_dir, reference_source):
    with fake_server(provider) as fake:
        fake.add(ERROR[provider](429, "slow down", headers={"Retry-After": "1"}),
                 TOOL[provider]("submit", reference_source))
        summary, trace = play(provider, fake, trace_dir)
    assert len(fake.requests) == 2
    waited = fake.requests[1].t - fake.requests[0].t
    assert waited >= 0.95, waited  # retry_max_wait_s is 0.2: only the header explains the wait
    assert summary.correct and [s.verdict for s in trace.steps] == ["pass"]


# -- (c) 401 fails fast ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
def test_auth_error_fails_fast(provider, key, trace_dir):
    with fake_server(provider) as fake:
        fake.add(ERROR[provider](401, "invalid x-api-key"), TOOL[provider]("submit", "x"))
        t0 = time.monotonic()
        with pytest.raises(AgentError) as err:
            play(provider, fake, trace_dir)
        assert time.monotonic() - t0 < 20
    msg = str(err.value)
    assert "authentication failed" in msg and KEY_ENV in msg and f"fake-{provider}-model" in msg
    assert fake.base_url in msg
    assert len(fake.requests) == 1


# -- (d) malformed tool-call arguments -------------------------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
def test_malformed_arguments_become_parse_error(provider, key, trace_dir, reference_source):
    with fake_server(provider) as fake:
        if provider in ("openai", "openai-responses"):
            bad = TOOL[provider]("check", arguments='{"source": "import torch\\n')  # cut JSON string
        else:
            bad = anthropic_tool_use("check", tool_input='{"source": "import torch')  # input not an object
        fake.add(bad, TOOL[provider]("submit", reference_source))
        summary, trace = play(provider, fake, trace_dir)
    assert len(trace.steps) == 2
    assert trace.steps[0].error and trace.steps[0].judge_result is None
    assert "Could not parse the action" in trace.steps[0].observation
    assert trace.steps[1].verdict == "pass" and summary.correct
    # the usage of the unrecorded turn is carried into the next step's meta
    assert trace.steps[1].meta.calls == 2 and trace.steps[1].meta.tokens_in == 2000
    sent = request_text(fake.requests[1].body)
    assert "Could not parse the action" in sent and "its arguments were" in sent


# -- (e) 500 then success ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
def test_server_error_is_retried(provider, key, trace_dir, reference_source):
    with fake_server(provider) as fake:
        fake.add(ERROR[provider](500, "internal error"), ERROR[provider](503, "unavailable"),
                 TOOL[provider]("submit", reference_source))
        summary, _ = play(provider, fake, trace_dir)
    assert len(fake.requests) == 3 and summary.correct
    assert fake.requests[1].body == fake.requests[0].body == fake.requests[2].body


@pytest.mark.parametrize("provider", PROVIDERS)
def test_retries_exhausted_is_a_clear_error(provider, key, trace_dir):
    with fake_server(provider) as fake:
        fake.add(*[ERROR[provider](500, "boom") for _ in range(3)])
        with pytest.raises(AgentError, match="still failing after 3 attempts"):
            play(provider, fake, trace_dir, max_retries=2)
    assert len(fake.requests) == 3


# -- (f) plain-text protocol ------------------------------------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
def test_plain_text_fallback(provider, key, trace_dir, reference_source):
    reply = f"Here is my solution.\n\n```python\n{reference_source}```\n\ntool: check\n"
    with fake_server(provider) as fake:
        fake.add(TEXT[provider](reply), TEXT[provider]("Looks good.\ntool: submit"))
        summary, trace = play(provider, fake, trace_dir, use_tools=False)
    assert [s.action.tool for s in trace.steps] == ["check", "submit"]
    assert [s.verdict for s in trace.steps] == ["pass", "pass"] and summary.correct
    assert all("tools" not in r.body for r in fake.requests)
    assert "tool: <one of" in request_text(fake.requests[0].body)
    assert json.dumps(trace.steps[0].observation)[1:-1] in request_text(fake.requests[1].body)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_refusal_costs_a_turn_and_is_explained(provider, key, trace_dir, reference_source):
    with fake_server(provider) as fake:
        fake.add(REFUSAL[provider]("I won't write that."), TOOL[provider]("submit", reference_source))
        summary, trace = play(provider, fake, trace_dir)
    assert trace.steps[0].error and "tool" in trace.steps[0].error
    assert summary.correct and len(trace.steps) == 2
    sent = request_text(fake.requests[1].body)
    assert "You did not call a tool" in sent and "Could not parse the action" in sent


# -- construction, cards, context --------------------------------------------------------------------------------

def test_missing_key_is_clear_at_construction(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(AgentError, match="OPENAI_API_KEY"):
        load_agent("openai-gpt")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(AgentError, match="ANTHROPIC_API_KEY"):
        load_agent("anthropic-claude")


def test_cards_load(monkeypatch):
    monkeypatch.delenv("LOCAL_LLM_API_KEY", raising=False)
    for name, kind in [("openai-gpt", "openai"), ("anthropic-claude", "anthropic"),
                       ("local-openai-compatible", "openai"), ("openai-gpt-responses", "openai"),
                       ("openai-gpt-mini", "openai"), ("anthropic-claude-haiku", "anthropic")]:
        assert load_agent_card(name).kind == kind
    assert load_agent_card("openai-gpt-responses").params["api"] == "responses"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
    responses = load_agent("openai-gpt-responses")
    chat = load_agent("openai-gpt")
    assert responses.params.api == "responses" and chat.params.api == "chat"
    assert responses.params.model == chat.params.model
    responses.close()
    chat.close()
    with pytest.raises(CardError, match="api"):
        load_agent("openai-gpt", api="assistants")
    agent = load_agent("local-openai-compatible")  # no key needed: allow_missing_key
    assert agent.params.base_url == "http://127.0.0.1:8000/v1"
    agent.close()
    with pytest.raises(CardError, match="tempreature"):
        load_agent("local-openai-compatible", tempreature=0.5)


def test_truncated_context_summarises_old_turns(key):
    with FakeProvider("openai") as fake:
        agent = make_agent("openai", fake, context="truncate", keep_turns=2, summary_lines=1)
        agent.reset({"task": "TASK TEXT", "feedback": "", "turn": 0}, {})
        agent.turns = [Turn(Reply(text=f"r{i}"), feedback=f"verdict {i}\ndetail {i}", tool="check") for i in range(5)]
        first, kept = agent._context()
        agent.close()
    assert first.startswith("Task statement:\n\nTASK TEXT") and [t.reply.text for t in kept] == ["r3", "r4"]
    assert "verdict 0" in first and "verdict 2" in first and "detail 0" not in first and "verdict 3" not in first


def test_parse_text_reply():
    assert parse_text_reply("```cuda\n__global__ void k() {}\n```\nTool: Benchmark") == \
        ("benchmark", "__global__ void k() {}\n")
    assert parse_text_reply("no tool here") == (None, "")
    assert parse_text_reply("tool: submit") == ("submit", "")


def test_unknown_tool_name_is_explained(key, trace_dir, reference_source):
    with FakeProvider("openai") as fake:
        fake.add(openai_tool_call("run_tests", reference_source), openai_tool_call("submit", reference_source))
        summary, trace = play("openai", fake, trace_dir)
    assert "unknown tool" in trace.steps[0].error and summary.correct
    assert trace.steps[1].meta.calls == 2
    assert "There is no tool 'run_tests'" in request_text(fake.requests[1].body)


# -- the Responses API specifics -----------------------------------------------------------------------------------

def test_responses_request_params(key, trace_dir, reference_source):
    with FakeProvider("openai") as fake:
        fake.add(responses_tool_call("submit", reference_source, tokens_in=321, tokens_out=45))
        summary, trace = play("openai-responses", fake, trace_dir, temperature=0.3, reasoning_effort="high",
                              max_tokens=777)
    body = fake.requests[0].body
    assert fake.requests[0].path == "/v1/responses" and summary.correct
    assert body["model"] == "fake-openai-responses-model" and body["temperature"] == 0.3
    assert body["reasoning"] == {"effort": "high"} and "reasoning_effort" not in body
    assert body["max_output_tokens"] == 777 and body["store"] is False and body["tool_choice"] == "auto"
    meta = trace.steps[0].meta.model_dump()
    assert (meta["tokens_in"], meta["tokens_out"]) == (321, 45)
    assert meta["cost_usd"] == pytest.approx((321 * 2.0 + 45 * 10.0) / 1e6)


def test_responses_defaults_leave_optional_fields_out(key, trace_dir, reference_source):
    with FakeProvider("openai") as fake:
        fake.add(responses_tool_call("submit", reference_source))
        play("openai-responses", fake, trace_dir)
    body = fake.requests[0].body
    assert "temperature" not in body and "reasoning" not in body


def test_responses_several_calls_run_the_first(key, trace_dir, reference_source):
    with FakeProvider("openai") as fake:
        fake.add(responses_tool_call("check", reference_source, extra_calls=("benchmark",)),
                 responses_tool_call("submit", ""))
        summary, trace = play("openai-responses", fake, trace_dir)
    assert [s.action.tool for s in trace.steps] == ["check", "submit"] and summary.correct
    items = fake.requests[1].body["input"]
    calls = [i for i in items if i.get("type") == "function_call"]
    outs = {i["call_id"]: i["output"] for i in items if i.get("type") == "function_call_output"}
    assert [c["name"] for c in calls] == ["check", "benchmark"]
    assert set(outs) == {c["call_id"] for c in calls}  # every call answered, as the API requires
    assert outs[calls[0]["call_id"]].startswith("Only your first tool call (check) was run")
    assert trace.steps[0].observation in outs[calls[0]["call_id"]]
    assert outs[calls[1]["call_id"]].startswith("Not run")


def test_responses_text_reply_without_call(key, trace_dir, reference_source):
    with FakeProvider("openai") as fake:
        fake.add(responses_text("Thinking about it."), responses_tool_call("submit", reference_source))
        summary, trace = play("openai-responses", fake, trace_dir)
    assert trace.steps[0].error and summary.correct
    items = fake.requests[1].body["input"]
    assert items[1] == {"role": "assistant", "content": "Thinking about it."}
    assert items[2]["role"] == "user" and "You did not call a tool" in items[2]["content"]
    assert trace.steps[1].meta.calls == 2
