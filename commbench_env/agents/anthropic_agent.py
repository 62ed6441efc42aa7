"""AnthropicAgent: the Anthropic Messages API with tools (tool_use / tool_result blocks), through the anthropic SDK.

See llm.py for the shared behaviour. `reasoning_effort` is sent as output_config.effort.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic

from .llm import TOOL_SPECS, LLMAgent, Reply, ToolCall, Turn

MESSAGES_TOOLS = [{"name": s["name"], "description": s["description"], "input_schema": s["parameters"]}
                  for s in TOOL_SPECS]


class AnthropicAgent(LLMAgent):
    provider = "anthropic"
    default_key_env = "ANTHROPIC_API_KEY"

    def _make_client(self, api_key: str) -> anthropic.Anthropic:
        # max_retries=0: tenacity (llm.py) is the single retry layer
        return anthropic.Anthropic(api_key=api_key, base_url=self.params.base_url, timeout=self.params.timeout_s,
                                   max_retries=0)

    def _status_of(self, exc: BaseException) -> int | None:
        return exc.status_code if isinstance(exc, anthropic.APIStatusError) else None

    def _is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, (anthropic.APIConnectionError, anthropic.APITimeoutError))

    def messages(self, first_user: str, turns: list[Turn]) -> list[dict[str, Any]]:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": first_user}]
        for t in turns:
            r = t.reply
            content: list[dict[str, Any]] = []
            if r.text:
                content.append({"type": "text", "text": r.text})
            for c in r.tool_calls:
                # the API wants an object back; an undecodable input is echoed as an empty one
                args = c.arguments
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except json.JSONDecodeError:
                        args = None
                content.append({"type": "tool_use", "id": c.id, "name": c.name,
                                "input": args if isinstance(args, dict) else {}})
            if not content:
                content.append({"type": "text", "text": r.refusal or "(empty reply)"})
            msgs.append({"role": "assistant", "content": content})
            if r.tool_calls:
                results = [{"type": "tool_result", "tool_use_id": r.tool_calls[0].id, "content": t.result_text()}]
                results += [{"type": "tool_result", "tool_use_id": c.id, "is_error": True,
                             "content": "Not run: call exactly one tool per turn."} for c in r.tool_calls[1:]]
                msgs.append({"role": "user", "content": results})
            else:
                msgs.append({"role": "user", "content": t.result_text()})
        return msgs

    def _request(self, system: str, first_user: str, turns: list[Turn]) -> Reply:
        p = self.params
        kwargs: dict[str, Any] = {"model": p.model, "max_tokens": p.max_tokens, "system": system,
                                  "messages": self.messages(first_user, turns)}
        if p.use_tools:
            kwargs["tools"] = MESSAGES_TOOLS
        if p.temperature is not None:
            kwargs["temperature"] = p.temperature
        if p.reasoning_effort is not None:
            kwargs["output_config"] = {"effort": p.reasoning_effort}
        resp = self.client.messages.create(**kwargs)
        texts, calls = [], []
        for block in resp.content or []:
            kind = getattr(block, "type", None)
            if kind == "text":
                texts.append(block.text)
            elif kind == "tool_use":
                calls.append(ToolCall(id=block.id, name=block.name, arguments=block.input))
        usage = resp.usage
        tin = 0
        if usage is not None:
            tin = (usage.input_tokens or 0) + (getattr(usage, "cache_creation_input_tokens", 0) or 0) \
                + (getattr(usage, "cache_read_input_tokens", 0) or 0)
        text = "\n".join(texts)
        return Reply(text=text, tool_calls=calls, tokens_in=tin, tokens_out=(usage.output_tokens or 0) if usage else 0,
                     refusal=text if resp.stop_reason == "refusal" else None, stop_reason=resp.stop_reason)
