"""Agents: anything that turns observations into actions. Built-ins here; cards in the top-level agents/ folder."""

from .base import Agent, AgentCard, list_agent_cards, load_agent, load_agent_card

__all__ = ["Agent", "AgentCard", "list_agent_cards", "load_agent", "load_agent_card"]
