"""OpenAIAgent: the OpenAI Chat Completions API with function tools, through the openai SDK.

Works with api.openai.com and with any OpenAI-compatible server (vLLM, SGLang, llama.cpp, Ollama) through
`base_url`. Only `api = "chat"` is implemented (the Responses API is not). See llm.py for the shared behaviour.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from .llm import TOOL_SPECS, LLMAgent, Reply, ToolCall, Turn

CHAT_TOOLS = [{"type": "function", "function": spec} for spec in TOOL_SPECS]


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
                                             "function": {"name": c.name, "arguments": c.arguments
                                                          if isinstance(c.arguments, str) else json.dumps(c.arguments)}}
                                            for c in r.tool_calls]})
                msgs.append({"role": "tool", "tool_call_id": r.tool_calls[0].id, "content": t.result_text()})
                for c in r.tool_calls[1:]:
                    msgs.append({"role": "tool", "tool_call_id": c.id,
                                 "content": "Not run: call exactly one tool per turn."})
            else:
                msgs.append({"role": "assistant", "content": r.text or r.refusal or ""})
                msgs.append({"role": "user", "content": t.result_text()})
        return msgs

    def _request(self, system: str, first_user: str, turns: list[Turn]) -> Reply:
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
