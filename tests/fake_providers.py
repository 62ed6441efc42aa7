"""Real HTTP servers on 127.0.0.1 that speak the OpenAI Chat Completions, OpenAI Responses and Anthropic Messages
wire protocols.

A `FakeProvider` serves a script: each POST to one of its endpoints takes the next scripted reply (status, headers,
JSON body; the fake OpenAI server serves both /v1/chat/completions and /v1/responses from one script, so a test
scripts the reply shape of the API it exercises). Every request is recorded (path, headers, decoded JSON, arrival time) so tests can assert on what the real
SDK clients sent. When the script runs out the server answers 400, which the agents do not retry.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

_ids = itertools.count(1)


@dataclass
class Scripted:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any
    t: float


# -- OpenAI Chat Completions ----------------------------------------------------------------------------

def _chat(message: dict[str, Any], finish: str, tokens_in: int, tokens_out: int, model: str) -> Scripted:
    return Scripted(200, {
        "id": f"chatcmpl-{next(_ids)}", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out, "total_tokens": tokens_in + tokens_out},
    })


def openai_tool_call(tool: str, source: str = "", *, arguments: str | None = None, text: str | None = None,
                     tokens_in: int = 1000, tokens_out: int = 200, model: str = "fake-gpt") -> Scripted:
    """A reply with one function call; `arguments` replaces the JSON {"source": ...} (e.g. malformed text)."""
    args = json.dumps({"source": source}) if arguments is None else arguments
    msg = {"role": "assistant", "content": text, "refusal": None,
           "tool_calls": [{"id": f"call_{next(_ids)}", "type": "function",
                           "function": {"name": tool, "arguments": args}}]}
    return _chat(msg, "tool_calls", tokens_in, tokens_out, model)


def openai_text(text: str, *, tokens_in: int = 1000, tokens_out: int = 200, model: str = "fake-gpt") -> Scripted:
    return _chat({"role": "assistant", "content": text, "refusal": None}, "stop", tokens_in, tokens_out, model)


def openai_refusal(text: str = "I can't help with that.", **kw: Any) -> Scripted:
    return _chat({"role": "assistant", "content": None, "refusal": text}, "stop", kw.get("tokens_in", 10),
                 kw.get("tokens_out", 5), kw.get("model", "fake-gpt"))


def openai_error(status: int, message: str, *, headers: dict[str, str] | None = None) -> Scripted:
    kind = {400: "invalid_request_error", 401: "invalid_request_error", 429: "rate_limit_exceeded"}.get(status,
                                                                                                       "server_error")
    code = {401: "invalid_api_key", 429: "rate_limit_exceeded"}.get(status)
    return Scripted(status, {"error": {"message": message, "type": kind, "param": None, "code": code}}, headers or {})


# -- OpenAI Responses -----------------------------------------------------------------------------------------

def _response(output: list[dict[str, Any]], tokens_in: int, tokens_out: int, model: str, *,
              status: str = "completed", incomplete: str | None = None) -> Scripted:
    """The JSON of a non-streamed POST /v1/responses (store=false, so nothing is kept server side)."""
    now = int(time.time())
    return Scripted(200, {
        "id": f"resp_{next(_ids)}", "object": "response", "created_at": now, "model": model, "status": status,
        "completed_at": now if status == "completed" else None, "background": False,
        "error": None, "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": None, "max_output_tokens": None, "max_tool_calls": None, "metadata": {},
        "output": output, "parallel_tool_calls": True, "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None}, "service_tier": "default", "store": False,
        "temperature": 1.0, "text": {"format": {"type": "text"}, "verbosity": "medium"}, "tool_choice": "auto",
        "tools": [], "top_p": 1.0, "truncation": "disabled", "user": None,
        "usage": {"input_tokens": tokens_in, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": tokens_out, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": tokens_in + tokens_out},
    })


def _output_message(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": f"msg_{next(_ids)}", "type": "message", "status": "completed", "role": "assistant",
            "content": parts}


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def responses_tool_call(tool: str, source: str = "", *, arguments: str | None = None, text: str | None = None,
                        extra_calls: tuple[str, ...] = (), tokens_in: int = 1000, tokens_out: int = 200,
                        model: str = "fake-gpt") -> Scripted:
    """A Responses reply with a function_call item (after an optional message); `arguments` replaces the JSON
    {"source": ...}; `extra_calls` adds further function calls (tool names, empty source)."""
    args = json.dumps({"source": source}) if arguments is None else arguments
    output: list[dict[str, Any]] = [_output_message([_output_text(text)])] if text else []
    for name, a in [(tool, args), *[(t, json.dumps({"source": ""})) for t in extra_calls]]:
        n = next(_ids)
        output.append({"id": f"fc_{n}", "type": "function_call", "status": "completed", "call_id": f"call_{n}",
                       "name": name, "arguments": a})
    return _response(output, tokens_in, tokens_out, model)


def responses_text(text: str, *, tokens_in: int = 1000, tokens_out: int = 200, model: str = "fake-gpt") -> Scripted:
    return _response([_output_message([_output_text(text)])], tokens_in, tokens_out, model)


def responses_refusal(text: str = "I can't help with that.", **kw: Any) -> Scripted:
    return _response([_output_message([{"type": "refusal", "refusal": text}])], kw.get("tokens_in", 10),
                     kw.get("tokens_out", 5), kw.get("model", "fake-gpt"))


# -- Anthropic Messages ---------------------------------------------------------------------------------

def _message(content: list[dict[str, Any]], stop: str, tokens_in: int, tokens_out: int, model: str) -> Scripted:
    return Scripted(200, {
        "id": f"msg_{next(_ids)}", "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out},
    })


def anthropic_tool_use(tool: str, source: str = "", *, tool_input: Any = None, text: str | None = None,
                       tokens_in: int = 1000, tokens_out: int = 200, model: str = "fake-claude") -> Scripted:
    """A reply with one tool_use block; `tool_input` replaces {"source": ...} (e.g. a non-object)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content.append({"type": "tool_use", "id": f"toolu_{next(_ids)}", "name": tool,
                    "input": {"source": source} if tool_input is None else tool_input})
    return _message(content, "tool_use", tokens_in, tokens_out, model)


def anthropic_text(text: str, *, tokens_in: int = 1000, tokens_out: int = 200, model: str = "fake-claude") -> Scripted:
    return _message([{"type": "text", "text": text}], "end_turn", tokens_in, tokens_out, model)


def anthropic_refusal(text: str = "I can't help with that.", **kw: Any) -> Scripted:
    return _message([{"type": "text", "text": text}], "refusal", kw.get("tokens_in", 10), kw.get("tokens_out", 5),
                    kw.get("model", "fake-claude"))


def anthropic_error(status: int, message: str, *, headers: dict[str, str] | None = None) -> Scripted:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
    return Scripted(status, {"type": "error", "error": {"type": kind, "message": message}}, headers or {})


# -- the server -----------------------------------------------------------------------------------------

class FakeProvider:
    """`FakeProvider("openai")` serves POST /v1/chat/completions and POST /v1/responses;
    `FakeProvider("anthropic")` POST /v1/messages."""

    PATHS: ClassVar[dict[str, tuple[str, ...]]] = {"openai": ("/v1/chat/completions", "/v1/responses"),
                                                   "anthropic": ("/v1/messages",)}

    def __init__(self, provider: str, script: list[Scripted] | None = None):
        self.provider = provider
        self.paths = self.PATHS[provider]
        self.script: list[Scripted] = list(script or [])
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, reply: Scripted) -> None:
                data = json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"null")
                except json.JSONDecodeError:
                    body = raw.decode(errors="replace")
                with fake._lock:
                    fake.requests.append(Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                                                  time.monotonic()))
                    reply = fake.script.pop(0) if fake.script and self.path in fake.paths else None
                if reply is None:
                    err = openai_error if fake.provider == "openai" else anthropic_error
                    why = "script exhausted" if self.path in fake.paths else f"unknown path {self.path}"
                    reply = err(400, f"fake {fake.provider} server: {why}")
                self._send(reply)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """What the SDK wants: the OpenAI SDK appends /chat/completions or /responses, the Anthropic SDK /v1/messages."""
        root = f"http://127.0.0.1:{self.port}"
        return root + "/v1" if self.provider == "openai" else root

    def add(self, *replies: Scripted) -> FakeProvider:
        with self._lock:
            self.script.extend(replies)
        return self

    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]

    def __enter__(self) -> FakeProvider:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
