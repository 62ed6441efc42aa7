"""Where the card folders (tasks/, agents/, sandboxes/) and user data live."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_REPO_ROOT = PACKAGE_DIR.parent
_BUNDLED = PACKAGE_DIR / "_cards"
CUDA_HEADER_DIR = PACKAGE_DIR / "judge" / "cuda"  # commbench.h: compiled into every candidate, quoted in CUDA prompts


def cards_root() -> Path:
    """Folder holding tasks/, agents/ and sandboxes/.

    COMMBENCH_HOME wins; then the repository checkout (editable installs); then the copy bundled in the wheel.
    """
    env = os.environ.get("COMMBENCH_HOME")
    if env:
        return Path(env).expanduser().resolve()
    if (_REPO_ROOT / "tasks").is_dir():
        return _REPO_ROOT
    return _BUNDLED


def tasks_dir() -> Path:
    return cards_root() / "tasks"


def agents_dir() -> Path:
    return cards_root() / "agents"


def sandboxes_dir() -> Path:
    return cards_root() / "sandboxes"


def cache_dir() -> Path:
    """Per-user cache (reference figures, build outputs). COMMBENCH_CACHE overrides."""
    env = os.environ.get("COMMBENCH_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "commbench"
    base.mkdir(parents=True, exist_ok=True)
    return base


def package_parent() -> Path:
    """The folder to put on PYTHONPATH so a sandboxed interpreter imports this very package."""
    return PACKAGE_DIR.parent
