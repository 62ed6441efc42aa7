"""Sandboxes: where candidate code runs. One small interface, several backends (local now, docker later)."""

from .base import ExecResult, HardwareInfo, Sandbox
from .profiles import SandboxProfile, list_profiles, load_profile, open_sandbox

__all__ = ["ExecResult", "HardwareInfo", "Sandbox", "SandboxProfile", "list_profiles", "load_profile", "open_sandbox"]
