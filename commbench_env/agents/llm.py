"""Shared logic of the LLM agents (OpenAI Chat Completions or Responses, any OpenAI-compatible server, and
Anthropic Messages).

An LLM agent keeps a provider-neutral transcript of the episode: the task statement, then one `Turn` per env step
(the model's reply and the judge feedback that answered it). Each turn the provider subclass renders that
transcript into its wire format, calls the model once (with tenacity retries), and the reply becomes an env action:

* one tool call `compile|check|benchmark|profile|submit|sanitize(source=...)` -> `{"tool", "source", "meta"}`;
  an empty `source` reuses the last code. If the model calls several tools, the first one runs and the others are
  answered "not run: one tool per turn".
* tool-call arguments that are not a JSON object with a string `source` -> the raw argument text is sent to the env
  as a string action, which the env answers with a parse-error observation (the turn counts, as for any garbage
  action); the next tool result tells the model what was wrong with its arguments, followed by the env's feedback.
* no tool call (a refusal, plain text, or `use_tools = false`) -> the text is parsed for a `tool: <name>` line and
  the last fenced code block (any language tag: python, cuda, cpp, ...). With a tool line the action is
  `{"tool", "source": block or ""}`; without one the text itself is sent as a string action, so the env answers
  with its parse error and its action help, and the model reads that on the next turn. Nothing here invents a
  tool the model did not ask for (no silent `compile` of old code), and nothing crashes the episode.

Token usage and cost go into `action["meta"]` = {message, tokens_in, tokens_out, cost_usd, model, calls}; the env
records meta in the trace. String actions carry no meta, so their usage is added to the next dict action's meta
(`calls` says how many model calls the figures cover).

Retries: tenacity is the only retry layer (the SDK clients get max_retries=0). 408/409/429/5xx/529 (overloaded),
timeouts and connection errors are retried with exponential backoff and jitter, never sooner than a Retry-After
(or retry-after-ms) header asks; 400/401/403/404/422 raise `AgentError` at once with a message that says what to fix.
"""

from __future__ import annotations

import email.utils
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from ..episode.actions import TOOLS, code_blocks, tool_named_in
from ..config import StrictModel
from ..errors import AgentError
from .base import AgentCard


class LLMParams(StrictModel):
    model: str = Field(description="model name as the provider spells it")
    base_url: str | None = Field(default=None, description="API base URL; default: the provider's")
    api_key_env: str | None = Field(default=None, description="env var holding the key; default per provider")
    allow_missing_key: bool = Field(default=False, description="local servers: use a dummy key if the var is unset")
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int = Field(default=8192, ge=1, description="completion budget per call (Anthropic requires one)")
    reasoning_effort: str | None = Field(default=None, description="OpenAI reasoning_effort / Anthropic output_config.effort")
    use_tools: bool = Field(default=True, description="native tool calling; false: fenced block + 'tool: <name>' line")
    max_retries: int = Field(default=6, ge=0, description="retries after the first attempt (tenacity)")
    retry_min_wait_s: float = Field(default=1.0, ge=0.0, description="backoff base (exponential with jitter)")
    retry_max_wait_s: float = Field(default=30.0, ge=0.0, description="backoff cap (a Retry-After may ask for more)")
    retry_after_cap_s: float = Field(default=300.0, ge=0.0, description="longest Retry-After honoured")
    timeout_s: float = Field(default=600.0, gt=0.0, description="per-request timeout")
    context: Literal["full", "truncate"] = "full"
    keep_turns: int = Field(default=4, ge=1, description="context=truncate: turns kept verbatim")
    summary_lines: int = Field(default=3, ge=1, description="context=truncate: feedback lines kept of older turns")
    price_per_mtok_input: float = Field(default=0.0, ge=0.0, description="USD per million input tokens")
    price_per_mtok_output: float = Field(default=0.0, ge=0.0, description="USD per million output tokens")
    api: Literal["chat", "responses"] = Field(default="chat", description="OpenAI API used: chat (Chat Completions, "
                                              "also OpenAI-compatible servers) or responses (Responses API)")
    system_prompt: str | None = Field(default=None, description="replaces the built-in system prompt")


# -- prompts and tool schema ------------------------------------------------------------------------------

_TOOL_DOC = {
    "compile": "Build/import your file and run the static checks only (fast).",
    "check": "Run the visible and hidden correctness cases at the task's world size.",
    "benchmark": "Time your code at the task's benchmark sizes (every timed output is verified too).",
    "profile": "Run your code under the profiler and report where time goes.",
    "submit": "Final scoring (correctness + performance). Ends the episode.",
    "sanitize": "Run compute-sanitizer on CUDA tasks (memory/race checks).",
}
_SOURCE_DOC = ("The complete text of the solution file named in the task (not a diff). "
               "An empty string reuses the code you sent last.")

# One function per tool: the tool name is the function name, so the model's choice is explicit and the schema
# stays a single string parameter (simpler for small/local models than an enum + source pair).
TOOL_SPECS: list[dict[str, Any]] = [
    {"name": t, "description": _TOOL_DOC[t],
     "parameters": {"type": "object", "properties": {"source": {"type": "string", "description": _SOURCE_DOC}},
                    "required": ["source"], "additionalProperties": False}}
    for t in TOOLS
]

SYSTEM_PROMPT = """You are an expert in GPU communication code (torch.distributed, NCCL, CUDA). You are solving one \
CommBench task over several turns.

How the loop works:
- The first message is the task statement. It names the single file you write (e.g. solution.py) and the function(s) it must define.
- Each turn, call exactly ONE tool with the COMPLETE text of that file as `source` (or an empty `source` to reuse the code you sent last).
- Tools: compile (build and static checks), check (correctness tests), benchmark (tests + timing against the reference), \
profile (where the time goes), sanitize (compute-sanitizer, CUDA tasks only), submit (final scoring; ENDS the episode).
- The tool result is the judge's verdict and feedback on your code. Read it, fix problems, then improve speed.
- The turn budget is small: check before you submit, and submit your best correct code before the budget runs out \
(if it runs out, your last code is scored).
"""

TEXT_PROTOCOL = """
You have no function-calling tools. Answer each turn with the complete file in ONE fenced code block \
(```python or ```cuda) followed by a line of its own:
tool: <one of compile, check, benchmark, profile, sanitize, submit>
Omit the code block to reuse the code you sent last.
"""



# -- transcript -----------------------------------------------------------------------------------------

@dataclass
class ToolCall:
    id: str
    name: str
    arguments: Any  # OpenAI: the raw JSON string; Anthropic: the decoded input (normally a dict)


@dataclass
class Reply:
    """One model reply, provider-neutral."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0
    refusal: str | None = None
    stop_reason: str | None = None
    raw: Any = None  # the provider's assistant message as sent back in later requests


@dataclass
class Turn:
    reply: Reply
    feedback: str | None = None       # env feedback that answered this reply (None until the next act)
    note: str = ""                    # what the agent tells the model before the feedback (e.g. bad arguments)
    tool: str | None = None           # the tool the action asked for, for summaries

    def result_text(self) -> str:
        fb = self.feedback if self.feedback is not None else "(no feedback)"
        return f"{self.note}\n\n{fb}".strip() if self.note else fb


def summarise(feedback: str | None, lines: int) -> str:
    text = (feedback or "").strip().splitlines()
    head = "\n".join(text[:lines])
    return head + ("\n  [...]" if len(text) > lines else "")


def parse_text_reply(text: str) -> tuple[str | None, str]:
    """(tool or None, source) from a plain-text reply: its last 'tool: <name>' line and last fenced block (any
    language tag), by the env's one grammar (episode/actions.py)."""
    blocks = code_blocks(text)
    return tool_named_in(text), (blocks[-1] if blocks else "")


def retry_after_seconds(exc: BaseException) -> float | None:
    """Seconds a Retry-After / retry-after-ms header asks for, if the error carries a response."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    ra = headers.get("retry-after")
    if not ra:
        return None
    try:
        return max(0.0, float(ra))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(ra)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 520, 522, 524, 529})


# -- the agent ------------------------------------------------------------------------------------------

class LLMAgent:
    """Base class; subclasses set `provider`, `default_key_env`, and implement `_make_client`, `_request`,
    `_status_of` (HTTP status of an SDK error or None) and `_is_transient` (timeouts, connection errors)."""

    provider = "llm"
    default_key_env = "LLM_API_KEY"
    params_model: type[LLMParams] = LLMParams

    def __init__(self, card: AgentCard):
        self.name = card.name
        self.card = card
        self.params = card.parse_params(self.params_model)
        p = self.params
        self.key_env = p.api_key_env or self.default_key_env
        key = os.environ.get(self.key_env, "")
        if not key:
            if not p.allow_missing_key:
                raise AgentError(f"agent {self.name!r}: no API key for {self.provider} model {p.model!r}: "
                                 f"set the environment variable {self.key_env} (or set params.api_key_env to the "
                                 f"variable that holds it; local servers: params.allow_missing_key = true)")
            key = "EMPTY"
        self.client = self._make_client(key)
        self.system_prompt = (p.system_prompt or SYSTEM_PROMPT) + ("" if p.use_tools else TEXT_PROTOCOL)
        self.task_text = ""
        self.turns: list[Turn] = []
        self._carry = {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0, "calls": 0}
        self.total_cost_usd = 0.0

    # -- subclass hooks ----------------------------------------------------------------------------
    def _make_client(self, api_key: str) -> Any:
        raise NotImplementedError

    def _request(self, system: str, first_user: str, turns: list[Turn]) -> Reply:
        raise NotImplementedError

    def _status_of(self, exc: BaseException) -> int | None:
        raise NotImplementedError

    def _is_transient(self, exc: BaseException) -> bool:
        raise NotImplementedError

    # -- Agent protocol ----------------------------------------------------------------------------
    def reset(self, observation: dict[str, Any], info: dict[str, Any]) -> None:
        self.task_text = ("Task statement:\n\n" + observation.get("task", "")
                          + "\n\nStart now: call exactly one tool with the complete solution file.")
        self.turns = []
        self._carry = {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0, "calls": 0}

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Any:
        if self.turns and self.turns[-1].feedback is None:
            self.turns[-1].feedback = observation.get("feedback", "")
        first, kept = self._context()
        reply = self._call_with_retries(first, kept)
        cost = (reply.tokens_in * self.params.price_per_mtok_input
                + reply.tokens_out * self.params.price_per_mtok_output) / 1e6
        self.total_cost_usd += cost
        c = self._carry
        c["tokens_in"] += reply.tokens_in
        c["tokens_out"] += reply.tokens_out
        c["cost_usd"] += cost
        c["calls"] += 1
        turn = Turn(reply=reply)
        action = self._to_action(reply, turn)
        self.turns.append(turn)
        if isinstance(action, dict) and action["tool"] in TOOLS:  # else the env rejects it and drops its meta
            action["meta"] = {"message": (reply.text or reply.refusal or "")[:4000], "tokens_in": c["tokens_in"],
                              "tokens_out": c["tokens_out"], "cost_usd": round(c["cost_usd"], 8),
                              "model": self.params.model, "calls": c["calls"]}
            self._carry = {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0, "calls": 0}
        return action

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if callable(close):
            close()

    # -- reply -> action ---------------------------------------------------------------------------
    def _to_action(self, reply: Reply, turn: Turn) -> Any:
        if reply.tool_calls:
            call = reply.tool_calls[0]
            if len(reply.tool_calls) > 1:
                turn.note = (f"Only your first tool call ({call.name}) was run; call exactly one tool per turn.")
            args = call.arguments
            error = None
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError as exc:
                    error = f"not valid JSON ({exc})"
            if error is None and not isinstance(args, dict):
                error = f"a JSON {type(args).__name__}, not an object"
            if error is None and not isinstance(args.get("source", ""), str):
                error = "'source' is not a string"
            if error is not None:
                raw = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
                turn.note = (f"Your {call.name} call was not run: its arguments were {error}. Send "
                             "{\"source\": \"<the complete file as one JSON string>\"}. The environment answered:")
                turn.tool = None
                # a string action: the env parses it, fails, and answers with its parse-error observation
                return raw if raw.lstrip().startswith("{") else "{" + raw
            turn.tool = call.name
            if call.name not in TOOLS:  # sent as is: the env answers 'unknown tool'
                turn.note = f"There is no tool {call.name!r}; the tools are {', '.join(TOOLS)}. The environment answered:"
            return {"tool": call.name, "source": args.get("source", "") or ""}
        text = reply.text or reply.refusal or ""
        tool, source = parse_text_reply(text)
        if tool is not None:
            turn.tool = tool
            return {"tool": tool, "source": source}
        if self.params.use_tools:
            turn.note = ("You did not call a tool. Each turn, call exactly one of "
                         + ", ".join(TOOLS) + " with the complete file as `source`. The environment answered:")
        else:
            turn.note = "No 'tool: <name>' line found in your answer. The environment answered:"
        return text.strip() or "(empty reply: no tool call and no text)"

    # -- context -----------------------------------------------------------------------------------
    def _context(self) -> tuple[str, list[Turn]]:
        if self.params.context == "full" or len(self.turns) <= self.params.keep_turns:
            return self.task_text, self.turns
        old, kept = self.turns[: -self.params.keep_turns], self.turns[-self.params.keep_turns:]
        lines = ["", "", (f"[Earlier turns 1-{len(old)}, summarised: the code is omitted, the feedback cut to "
                          "its first lines]")]
        for i, t in enumerate(old, 1):
            lines.append(f"turn {i}: tool {t.tool or '(none/invalid)'} ->")
            lines.append("  " + summarise(t.result_text(), self.params.summary_lines).replace("\n", "\n  "))
        return self.task_text + "\n".join(lines), kept

    # -- retries -----------------------------------------------------------------------------------
    def _retryable(self, exc: BaseException) -> bool:
        if self._is_transient(exc):
            return True
        status = self._status_of(exc)
        return status is not None and (status in RETRY_STATUS or status >= 500)

    def _wait(self, state: RetryCallState) -> float:
        p = self.params
        base = wait_random_exponential(multiplier=p.retry_min_wait_s, max=p.retry_max_wait_s)(state)
        exc = state.outcome.exception() if state.outcome else None
        ra = retry_after_seconds(exc) if exc is not None else None
        if ra is not None:
            return max(base, min(ra, p.retry_after_cap_s))
        return max(base, p.retry_min_wait_s * 0.5)

    def _where(self) -> str:
        return f"{self.provider} model {self.params.model!r} at {self.params.base_url or 'the default base_url'}"

    def _call_with_retries(self, first: str, turns: list[Turn]) -> Reply:
        retrying = Retrying(stop=stop_after_attempt(self.params.max_retries + 1), wait=self._wait,
                            retry=retry_if_exception(self._retryable), reraise=True)
        try:
            return retrying(self._request, self.system_prompt, first, turns)
        except AgentError:
            raise
        except Exception as exc:
            raise self._explain(exc) from exc

    def _explain(self, exc: BaseException) -> AgentError:
        status = self._status_of(exc)
        detail = str(exc)[:500]
        where = self._where()
        if status in (401, 403):
            what = "authentication failed" if status == 401 else "permission denied"
            return AgentError(f"{what} (HTTP {status}) for {where}: check {self.key_env}. Provider said: {detail}")
        if status == 404:
            return AgentError(f"not found (HTTP 404) for {where}: check the model name and base_url. "
                              f"Provider said: {detail}")
        if status in (400, 413, 422):
            return AgentError(f"bad request (HTTP {status}) for {where}: check params (model, max_tokens, "
                              f"temperature, reasoning_effort) and the context size. Provider said: {detail}")
        if self._retryable(exc):
            return AgentError(f"{where} still failing after {self.params.max_retries + 1} attempts "
                              f"({type(exc).__name__}{f', HTTP {status}' if status else ''}): {detail}")
        return AgentError(f"call to {where} failed ({type(exc).__name__}): {detail}")
