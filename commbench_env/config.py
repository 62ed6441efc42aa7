"""Base for every typed card and config: unknown keys are errors, and load errors name file and field."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import CardError, NotFoundError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """A model that rejects unknown keys (typos in cards must not pass silently)."""

    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True)


def format_validation_error(path: Path | str, err: ValidationError) -> str:
    lines = [f"{path}: invalid card"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see the card documentation)"
        lines.append(f"  field '{loc}': {msg}")
    return "\n".join(lines)


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise CardError(f"{path}: file not found") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CardError(f"{path}: not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise CardError(f"{path}: not UTF-8 text (byte {exc.start}); a card is a TOML text file") from None
    except OSError as exc:
        raise CardError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def load_model(model: type[M], data: dict[str, Any], path: Path | str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise CardError(format_validation_error(path, exc)) from None


def list_cards(folder: Path) -> list[str]:
    """Names of the `<name>.toml` cards in a folder."""
    return sorted(p.stem for p in folder.glob("*.toml"))


def load_named_card(model: type[M], folder: Path, name_or_path: str | Path, what: str) -> M:
    """Load `folder/<name>.toml` (or a path) into `model`; the card's `name` must match its file name."""
    p = Path(name_or_path)
    if not p.suffix:
        p = folder / f"{name_or_path}.toml"
    if not p.is_file():
        raise NotFoundError(f"no {what} {str(name_or_path)!r}; known: {', '.join(list_cards(folder))}")
    card = load_model(model, read_toml(p), p)
    name = getattr(card, "name", p.stem)
    if name != p.stem and p.parent == folder:
        raise CardError(f"{p}: field 'name': is {name!r} but the file is {p.name}")
    card.source = str(p)  # type: ignore[attr-defined]
    return card
