"""Sandbox images: content-addressed tags, and building them without any container registry."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from .. import __version__
from ..errors import SandboxError
from ..paths import PACKAGE_DIR, cards_root
from .profiles import SandboxProfile

CPU_BASE = "commbench-base:bookworm"
Progress = Callable[[str], None]


def dockerfile(flavor: str) -> Path:
    for root in (cards_root(), PACKAGE_DIR.parent):
        p = root / "dockerfiles" / flavor / "Dockerfile"
        if p.is_file():
            return p
    raise SandboxError(f"no dockerfiles/{flavor}/Dockerfile next to the cards ({cards_root()})")


def _package_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(PACKAGE_DIR.rglob("*")):
        if p.is_file() and p.suffix in (".py", ".h") and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(PACKAGE_DIR)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def image_tag(profile: SandboxProfile) -> str:
    """commbench-<flavor>:<hash of Dockerfile, base, package version, declared dependencies and source, torch
    version>. The dependencies count because the image installs them: a new one (pyseccomp for the rank's syscall
    filter) must not be missing from an image built before it was declared."""
    d = profile.docker
    h = hashlib.sha256()
    h.update(dockerfile(d.flavor).read_bytes())
    h.update((d.base or "").encode() + __version__.encode())
    h.update("\n".join(_declared_dependencies()).encode())
    if not d.mount_package:  # the baked-in package is what runs: its source is part of the image
        h.update(_package_digest().encode())
    h.update(_torch_version().encode() if d.flavor == "cpu" else b"")
    return f"commbench-{d.flavor}:{h.hexdigest()[:12]}"


def _declared_dependencies() -> list[str]:
    """The package's runtime requirements, from the checkout's pyproject.toml or the installed metadata."""
    pyproject = PACKAGE_DIR.parent / "pyproject.toml"
    if pyproject.is_file():
        try:
            import tomllib
        except ImportError:  # Python 3.10
            import tomli as tomllib
        return sorted(tomllib.loads(pyproject.read_text()).get("project", {}).get("dependencies", []))
    try:
        return sorted(r for r in metadata.requires("commbench-env") or [] if "extra ==" not in r)
    except metadata.PackageNotFoundError:
        return []


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def _requirements() -> list[str]:
    """This package's runtime requirements, from its installed metadata (extras left out)."""
    reqs = metadata.requires("commbench-env") or []
    return [r for r in reqs if "extra ==" not in r]


def image_for(profile: SandboxProfile, client) -> str:
    """The image a docker profile runs; SandboxError with the command to build it when it is missing."""
    import docker

    tag = profile.docker.image or image_tag(profile)
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        raise SandboxError(f"image {tag} for profile {profile.name!r} is not built yet: run "
                           f"`commbench sandbox build {profile.name}`") from None
    return tag


def _run(cmd: list[str], progress: Progress, **kw) -> None:
    progress("$ " + " ".join(cmd[:6]) + (" ..." if len(cmd) > 6 else ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SandboxError(f"{cmd[0]} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")


def build_cpu_base(client, progress: Progress) -> None:
    """A Debian bookworm base with python3 from debootstrap, imported into Docker (no registry involved)."""
    import docker

    try:
        client.images.get(CPU_BASE)
        progress(f"base image {CPU_BASE} is present")
        return
    except docker.errors.ImageNotFound:
        pass
    if not shutil.which("debootstrap"):
        raise SandboxError("building the CPU base image needs debootstrap (apt-get install debootstrap) and root")
    with tempfile.TemporaryDirectory(prefix="commbench-rootfs-") as root:
        progress("debootstrap bookworm (about a minute)")
        _run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv", "bookworm", root,
              "http://deb.debian.org/debian"], progress, timeout=1800)
        progress(f"docker import -> {CPU_BASE}")
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(["docker", "import", "-", CPU_BASE], stdin=tar.stdout, capture_output=True, text=True)
        tar.wait()
        if imp.returncode != 0:
            raise SandboxError(f"docker import failed: {imp.stderr[-2000:]}")


def build_context(profile: SandboxProfile, ctx: Path, progress: Progress) -> None:
    """Dockerfile + wheels/: this package and its dependencies, resolved by the host's pip."""
    shutil.copy(dockerfile(profile.docker.flavor), ctx / "Dockerfile")
    wheels = ctx / "wheels"
    wheels.mkdir()
    repo = PACKAGE_DIR.parent
    if not (repo / "pyproject.toml").is_file():
        raise SandboxError("building an image needs the project's source tree (pyproject.toml beside commbench_env)")
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels)]
    if profile.docker.flavor == "cpu":
        pins = [f"torch=={_torch_version()}"] if _torch_version() else []
        progress("collecting wheels (the package, its dependencies" + (f", {pins[0]}" if pins else "") + ")")
        _run([*pip, str(repo), *pins], progress, timeout=1800)
        return
    # cuda: torch comes with the NVIDIA base; everything else travels as wheels
    progress("collecting wheels (the package and its dependencies except torch)")
    _run([*pip, "--no-deps", str(repo)], progress, timeout=1800)
    deps = [d for d in _requirements() if not d.lower().startswith("torch")]
    _run([*pip, *deps], progress, timeout=1800)


def build_image(profile: SandboxProfile, progress: Progress = lambda s: None, force: bool = False) -> str:
    """Build what a docker profile needs; returns the tag. An unchanged image is not rebuilt."""
    import docker

    from .engine import docker_client

    if profile.backend != "docker":
        raise SandboxError(f"profile {profile.name!r} uses the {profile.backend} backend: it needs no image")
    client = docker_client()
    tag = profile.docker.image or image_tag(profile)
    if profile.docker.image:
        progress(f"profile {profile.name} uses the image {tag} as is")
        return tag
    if not force:
        try:
            client.images.get(tag)
            progress(f"{tag} is up to date")
            return tag
        except docker.errors.ImageNotFound:
            pass
    if profile.docker.flavor == "cpu" and not profile.docker.base:
        build_cpu_base(client, progress)
    with tempfile.TemporaryDirectory(prefix="commbench-image-") as d:
        ctx = Path(d)
        build_context(profile, ctx, progress)
        args = {"BASE": profile.docker.base} if profile.docker.base else {}
        progress(f"docker build -> {tag}")
        try:
            for chunk in client.api.build(path=str(ctx), tag=tag, buildargs=args, network_mode="none", rm=True,
                                          decode=True):
                line = (chunk.get("stream") or "").strip()
                if line:
                    progress(line)
                if "error" in chunk:
                    raise SandboxError(f"docker build failed: {chunk['error']}")
        except docker.errors.APIError as exc:
            raise SandboxError(f"docker build failed: {exc}") from exc
    return tag
