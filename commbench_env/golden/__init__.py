"""Registry of golden semantics that task cards name in `semantics.op`."""

from __future__ import annotations

import importlib

from .base import CandidateError, GoldenOp

_MODULES = ("p2p", "collectives", "moe", "fusion", "utility", "p2p_patterns", "collective_algorithms",
            "utility_patterns", "ep_patterns", "fusion_patterns", "ep_sparse", "fusion_vocab", "fusion_attention",
            "utility_data", "cuda_copy", "cuda_ep_fusion", "cuda_collectives", "cuda_sync", "cuda_quant", "cuda_p2p",
            "cuda_ep_routing", "cuda_gemm_fusion", "cuda_ep_counts", "cuda_collectives2", "cuda_ep_ll", "cuda_p2p2",
            "cuda_sync2", "cuda_moe_gemm", "cuda_attention", "cuda_utility3", "cuda_fusion2")
_REGISTRY: dict[str, GoldenOp] = {}


def register(cls: type[GoldenOp]) -> type[GoldenOp]:
    """Class decorator: make an op available to cards by its `name`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY:
        raise ValueError(f"golden op {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls()
    return cls


_loaded = False


def _load() -> None:
    """Import every op module once. Not keyed on an empty registry: a module imported directly (a test importing
    its helpers) registers its own ops first, and the others must still load."""
    global _loaded
    if not _loaded:
        for m in _MODULES:
            importlib.import_module(f"{__name__}.{m}")
        _loaded = True


def get_op(name: str) -> GoldenOp:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown golden op {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def op_names() -> list[str]:
    _load()
    return sorted(_REGISTRY)


__all__ = ["CandidateError", "GoldenOp", "get_op", "op_names", "register"]
