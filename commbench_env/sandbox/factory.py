"""The one place that maps a profile to its backend: backends import profiles, never the other way."""

from __future__ import annotations

from .base import Sandbox
from .profiles import SandboxProfile, load_profile


def open_sandbox(profile: SandboxProfile | str) -> Sandbox:
    """A not-yet-started sandbox for a profile (a card name, a path, or a loaded profile)."""
    prof = load_profile(profile) if isinstance(profile, str) else profile
    if prof.backend == "local":
        from .local import LocalSandbox

        return LocalSandbox(prof)
    from .docker_backend import DockerSandbox

    return DockerSandbox(prof)
