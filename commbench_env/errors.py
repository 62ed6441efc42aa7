"""Error types. Agent mistakes are data (observations); these are for users and infrastructure."""

from __future__ import annotations


class CommBenchError(Exception):
    """Base class: a message that tells the user what was wrong and what to do."""


class CardError(CommBenchError):
    """A task, agent or sandbox card is missing or invalid; the message names the file and field."""


class NotFoundError(CommBenchError):
    """A task, agent card, sandbox profile or trace that was asked for does not exist."""


class SandboxError(CommBenchError):
    """The sandbox itself failed (could not start, died, lost files). Never the agent's fault."""


class JudgeInfraError(SandboxError):
    """The judge could not produce a result for reasons outside the candidate's control."""


class UnservableError(CommBenchError):
    """This host or sandbox cannot serve the request (a device mode or tool it lacks): raised before anything
    runs, never scored, never retried; the message names what would serve it."""


class AgentError(CommBenchError):
    """The model provider refused or failed (bad key, bad request, retries exhausted); the message says what to fix."""


class Interrupted(Exception):
    """The run was asked to stop (Ctrl-C, SIGTERM) before this episode finished: recorded as interrupted, never
    scored, and played again when the run resumes. Not a CommBenchError: nothing was wrong."""
