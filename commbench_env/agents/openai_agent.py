"""OpenAIAgent: OpenAI models with function tools, through the openai SDK.

`api = "chat"` (default): the Chat Completions API; works with api.openai.com and with any OpenAI-compatible server
(vLLM, SGLang, llama.cpp, Ollama) through `base_url`.
`api = "responses"`: the Responses API (`client.responses.create`), stateless (`store = false`): every request
carries the whole transcript as input items (user message, function_call, function_call_output, ...).

Both render the same provider-neutral transcript and share the reply -> action logic, retries and error handling
of llm.py.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from .llm import TOOL_SPECS, LLMAgent, Reply, ToolCall, Turn

CHAT_TOOLS = [{"type": "function", "function": spec} for spec in TOOL_SPECS]
# Responses API: flat function tools (name/description/parameters beside "type"), not nested under "function"
RESPONSES_TOOLS = [{"type": "function", **spec} for spec in TOOL_SPECS]
NOT_RUN = "Not run: call exactly one tool per turn."


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


class OpenAIAgent(LLMAgent):
    provider = "openai"
    default_key_env = "OPENAI_API_KEY"

    def _make_client(self, api_key: str) -> openai.OpenAI:
        # max_retries=0: tenacity (llm.py) is the single retry layer
        return openai.OpenAI(api_key=api_key, base_url=self.params.base_url, timeout=self.params.timeout_s,
                             max_retries=0)

    def _status_of(self, exc: BaseException) -> int | None:
        return exc.status_code if isinstance(exc, openai.APIStatusError) else None

    def _is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, (openai.APIConnectionError, openai.APITimeoutError))  # timeout subclasses connection

    def messages(self, system: str, first_user: str, turns: list[Turn]) -> list[dict[str, Any]]:
        msgs: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": first_user}]
        for t in turns:
            r = t.reply
            if r.tool_calls:
                msgs.append({"role": "assistant", "content": r.text or None,
                             "tool_calls": [{"id": c.id, "type": "function",
                                             "function": {"name": c.name, "arguments": _arguments_text(c.arguments)}}
                                            for c in r.tool_calls]})
                msgs.append({"role": "tool", "tool_call_id": r.tool_calls[0].id, "content": t.result_text()})
                for c in r.tool_calls[1:]:
                    msgs.append({"role": "tool", "tool_call_id": c.id, "content": NOT_RUN})
            else:
                msgs.append({"role": "assistant", "content": r.text or r.refusal or ""})
                msgs.append({"role": "user", "content": t.result_text()})
        return msgs

    def _request(self, system: str, first_user: str, turns: list[Turn]) -> Reply:
        if self.params.api == "responses":
            return self._request_responses(system, first_user, turns)
        return self._request_chat(system, first_user, turns)

    def _request_chat(self, system: str, first_user: str, turns: list[Turn]) -> Reply:
        p = self.params
        kwargs: dict[str, Any] = {"model": p.model, "messages": self.messages(system, first_user, turns)}
        if p.use_tools:
            kwargs["tools"] = CHAT_TOOLS
            kwargs["tool_choice"] = "auto"
        if p.temperature is not None:
            kwargs["temperature"] = p.temperature
        if p.reasoning_effort is not None:
            kwargs["reasoning_effort"] = p.reasoning_effort
        if p.base_url is None or "openai.com" in p.base_url:
            kwargs["max_completion_tokens"] = p.max_tokens  # o-series / gpt-5 reject max_tokens
        else:
            kwargs["max_tokens"] = p.max_tokens  # what OpenAI-compatible servers understand
        resp = self.client.chat.completions.create(**kwargs)
        if not resp.choices:
            return Reply(text="", stop_reason="no choices")
        choice = resp.choices[0]
        msg = choice.message
        calls = [ToolCall(id=c.id or f"call_{i}", name=c.function.name, arguments=c.function.arguments)
                 for i, c in enumerate(msg.tool_calls or []) if getattr(c, "function", None) is not None]
        usage = resp.usage
        return Reply(text=msg.content or "", tool_calls=calls, refusal=getattr(msg, "refusal", None),
                     tokens_in=(usage.prompt_tokens or 0) if usage else 0,
                     tokens_out=(usage.completion_tokens or 0) if usage else 0,
                     stop_reason=choice.finish_reason)

    # -- Responses API ---------------------------------------------------------------------------------------
    def input_items(self, first_user: str, turns: list[Turn]) -> list[dict[str, Any]]:
        """The transcript as Responses input items (the system prompt goes in `instructions`)."""
        items: list[dict[str, Any]] = [{"role": "user", "content": first_user}]
        for t in turns:
            r = t.reply
            if r.tool_calls:
                if r.text:
                    items.append({"role": "assistant", "content": r.text})
                for c in r.tool_calls:
                    items.append({"type": "function_call", "call_id": c.id, "name": c.name,
                                  "arguments": _arguments_text(c.arguments)})
                # every function_call needs its output: the first one ran, the others did not
                items.append({"type": "function_call_output", "call_id": r.tool_calls[0].id,
                              "output": t.result_text()})
                for c in r.tool_calls[1:]:
                    items.append({"type": "function_call_output", "call_id": c.id, "output": NOT_RUN})
            else:
                items.append({"role": "assistant", "content": r.text or r.refusal or ""})
                items.append({"role": "user", "content": t.result_text()})
        return items

    def _request_responses(self, system: str, first_user: str, turns: list[Turn]) -> Reply:
        p = self.params
        kwargs: dict[str, Any] = {"model": p.model, "instructions": system,
                                  "input": self.input_items(first_user, turns),
                                  "max_output_tokens": p.max_tokens, "store": False}
        if p.use_tools:
            kwargs["tools"] = RESPONSES_TOOLS
            kwargs["tool_choice"] = "auto"
        if p.temperature is not None:
            kwargs["temperature"] = p.temperature
        if p.reasoning_effort is not None:
            kwargs["reasoning"] = {"effort": p.reasoning_effort}
        resp = self.client.responses.create(**kwargs)
        texts: list[str] = []
        refusals: list[str] = []
        calls: list[ToolCall] = []
        for i, item in enumerate(resp.output or []):
            kind = getattr(item, "type", None)
            if kind == "function_call":
                calls.append(ToolCall(id=item.call_id or item.id or f"call_{i}", name=item.name,
                                      arguments=item.arguments if item.arguments is not None else ""))
            elif kind == "message":
                for part in item.content or []:
                    ptype = getattr(part, "type", None)
                    if ptype == "output_text" and part.text:
                        texts.append(part.text)
                    elif ptype == "refusal" and part.refusal:
                        refusals.append(part.refusal)
        usage = resp.usage
        stop = resp.status
        details = getattr(resp, "incomplete_details", None)
        if details is not None and getattr(details, "reason", None):
            stop = f"{stop}: {details.reason}"
        return Reply(text="\n\n".join(texts), tool_calls=calls, refusal="\n\n".join(refusals) or None,
                     tokens_in=(usage.input_tokens or 0) if usage else 0,
                     tokens_out=(usage.output_tokens or 0) if usage else 0,
                     stop_reason=stop)
