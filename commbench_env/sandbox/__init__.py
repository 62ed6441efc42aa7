"""Sandboxes: where candidate code runs. One small interface (base), its profiles (cards), the factory that picks a backend (local processes or Docker), and
the pool that lends them out."""

from .base import ExecResult, HardwareInfo, Sandbox
from .factory import open_sandbox
from .profiles import GPU_PROFILE_FOR_MODE, SandboxProfile, list_profiles, load_profile

__all__ = ["GPU_PROFILE_FOR_MODE", "ExecResult", "HardwareInfo", "Sandbox", "SandboxProfile", "list_profiles", "load_profile", "open_sandbox"]
