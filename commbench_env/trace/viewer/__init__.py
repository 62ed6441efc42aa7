"""The trace viewer: `commbench view PATH` serves run overviews and episode pages on 127.0.0.1."""

from .data import EpisodeIndex
from .server import export_static, serve

__all__ = ["EpisodeIndex", "export_static", "serve"]
