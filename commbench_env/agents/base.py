"""The Agent protocol and agent cards (`agents/<name>.toml`).

A card names a built-in kind (reference, scripted, replay) or any importable class as "module:Class"; the class
receives the card and validates its own `params`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, Field, ValidationError

from ..config import StrictModel, format_validation_error, list_cards, load_named_card
from ..errors import CardError
from ..paths import agents_dir

M = TypeVar("M", bound=BaseModel)

BUILTIN_KINDS = {
    "reference": "commbench_env.agents.reference:ReferenceAgent",
    "scripted": "commbench_env.agents.scripted:ScriptedAgent",
    "replay": "commbench_env.agents.replay:ReplayAgent",
    "openai": "commbench_env.agents.openai_agent:OpenAIAgent",
    "anthropic": "commbench_env.agents.anthropic_agent:AnthropicAgent",
}


@runtime_checkable
class Agent(Protocol):
    """Plays one episode at a time. `act` returns an env action: {'tool', 'source', optional 'meta'}."""

    name: str

    def reset(self, observation: dict[str, Any], info: dict[str, Any]) -> None: ...

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]: ...

    def close(self) -> None: ...


class AgentCard(StrictModel):
    name: str
    kind: str = Field(description="reference | scripted | replay | module:Class")
    description: str = ""
    max_turns: int | None = Field(default=None, ge=1, description="turn budget this agent is evaluated with")
    params: dict[str, Any] = Field(default_factory=dict)
    source: str = Field(default="", exclude=True)

    def parse_params(self, model: type[M]) -> M:
        """The card's params as the agent's own typed model; errors name the card file and the field."""
        try:
            return model.model_validate(self.params)
        except ValidationError as exc:
            raise CardError(format_validation_error(f"{self.source or self.name}: params", exc)) from None

    def resolve(self, relative: str) -> Path:
        """A path in params, relative to the card's folder."""
        p = Path(relative).expanduser()
        return p if p.is_absolute() or not self.source else Path(self.source).parent / p


def list_agent_cards(base: Path | None = None) -> list[str]:
    return list_cards(base or agents_dir())


def load_agent_card(name_or_path: str | Path) -> AgentCard:
    return load_named_card(AgentCard, agents_dir(), name_or_path, "agent card")


def load_agent(card: AgentCard | str | Path, **params: Any) -> Agent:
    """Instantiate the agent a card describes; `params` override the card's params."""
    if not isinstance(card, AgentCard):
        card = load_agent_card(card)
    if params:
        card = card.model_copy(update={"params": {**card.params, **params}})
    target = BUILTIN_KINDS.get(card.kind, card.kind)
    if ":" not in target:
        raise CardError(f"{card.source}: field 'kind': {card.kind!r} is neither a built-in "
                        f"({', '.join(BUILTIN_KINDS)}) nor 'module:Class'")
    mod_name, cls_name = target.split(":", 1)
    try:
        cls = getattr(importlib.import_module(mod_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise CardError(f"{card.source}: field 'kind': cannot import {target!r}: {exc}") from None
    return cls(card)
