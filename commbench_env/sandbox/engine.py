"""The Docker engine client, shared by the docker backend and the image builder (which import it, not each other)."""

from __future__ import annotations

from ..errors import SandboxError


def docker_client():
    """A client for the local engine, or SandboxError saying how to get one."""
    try:
        import docker
    except ImportError as exc:
        raise SandboxError("the docker backend needs the docker SDK: pip install docker") from exc
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means "no engine"
        raise SandboxError(f"no Docker engine is reachable ({exc}); start dockerd or use a local-* profile") from exc
    return client


def docker_available() -> bool:
    try:
        docker_client()
        return True
    except SandboxError:
        return False
