"""What makes two results comparable: the versions an episode was judged, timed and modelled with.

Recorded in every trace's `episode_start` (`EpisodeStart.versions`) and gathered into `commbench report`'s leaderboard
file, so that a row says which judge, which way of timing, which link model, which image and which hardware made it:
two rows that differ in any of these are not the same measurement.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from .. import __version__
from ..judge.host.result import SCHEMA_VERSION
from ..score.reference import TIMING_VERSION

if TYPE_CHECKING:
    from ..judge.link_model import LinkModel
    from ..sandbox import Sandbox, SandboxProfile
    from ..sandbox.base import HardwareInfo


class Versions(BaseModel):
    """Every field has a default: a trace written before versions were recorded loads with them empty."""

    model_config = ConfigDict(extra="ignore")
    judge_version: str = ""  # the package version the judge ran (JudgeResult.judge_version)
    judge_source: str = ""  # hash of the engine's source: two checkouts of one version can judge differently
    result_schema: str = ""  # JudgeResult.schema_version
    timing_version: int | None = None  # score/reference.py TIMING_VERSION: how the judge times calls
    comm_model: str = ""  # CPU: the link model the modelled time stands for, name and hash of its figures
    image_digest: str = ""  # docker sandboxes: the image the ranks ran in ("" for local sandboxes)
    hardware_fingerprint: str = ""  # HardwareInfo.fingerprint: same fingerprint, comparable timings


@lru_cache(maxsize=1)
def judge_source_digest() -> str:
    """A hash over the engine's .py and .h files (the judge, the reward, the golden semantics)."""
    from ..sandbox.images import _package_digest

    return _package_digest()[:16]


def comm_model_id(profile: "SandboxProfile", link_model: "LinkModel | None" = None) -> str:
    """`name:hash` of the link model CPU times are modelled on (the task's own where its card names one, else the
    profile's; the modelled time depends on every figure of it); on GPUs times are measured, so "measured"."""
    if profile.device_mode != "cpu":
        return "measured"
    lm = (link_model or profile.link_model).model_dump(mode="json")
    digest = hashlib.sha256(json.dumps(lm, sort_keys=True).encode()).hexdigest()[:8]
    return f"{lm.get('name', '?')}:{digest}"


def image_digest(profile: "SandboxProfile", sandbox: "Sandbox | None" = None) -> str:
    """The docker image ID of a running container where there is one, else the profile's content-addressed tag;
    "" for local sandboxes (they run the host's interpreter: judge_source and the hardware say what ran)."""
    if profile.backend != "docker":
        return ""
    container = getattr(sandbox, "_container", None)
    image = (getattr(container, "attrs", None) or {}).get("Image") if container is not None else None
    if image:
        return str(image)
    from ..sandbox.images import image_tag

    return profile.docker.image or image_tag(profile)


def episode_versions(profile: "SandboxProfile", hardware: "HardwareInfo", sandbox: "Sandbox | None" = None,
                     link_model: "LinkModel | None" = None) -> Versions:
    """The versions of an episode about to start on `profile` and `hardware` (`link_model`: the task's, where its
    card names one)."""
    return Versions(judge_version=__version__, judge_source=judge_source_digest(), result_schema=SCHEMA_VERSION,
                    timing_version=TIMING_VERSION, comm_model=comm_model_id(profile, link_model),
                    image_digest=image_digest(profile, sandbox), hardware_fingerprint=hardware.fingerprint)
