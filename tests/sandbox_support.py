"""Which sandbox backends can run here. In CI (COMMBENCH_REQUIRE_DOCKER=1) a missing Docker is a failure."""

from __future__ import annotations

import os

import pytest


def docker_ready() -> str | None:
    """None if docker-cpu sandboxes can start here, else the reason."""
    from commbench_env.errors import SandboxError
    from commbench_env.sandbox import load_profile
    from commbench_env.sandbox.docker_backend import docker_client
    from commbench_env.sandbox.images import image_for

    try:
        image_for(load_profile("docker-cpu"), docker_client())
    except SandboxError as exc:
        return str(exc)
    return None


def require_docker() -> None:
    why = docker_ready()
    if why:
        if os.environ.get("COMMBENCH_REQUIRE_DOCKER"):
            pytest.fail(f"Docker is required here (COMMBENCH_REQUIRE_DOCKER is set): {why}")
        pytest.skip(why)
