"""Element-wise comparison that pinpoints the first wrong element."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..cards import CaseSpec


def _fmt(x: torch.Tensor) -> str:
    v = x.item()
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def compare_tensor(expected: torch.Tensor, got: torch.Tensor, tol: tuple[float, float]) -> dict | None:
    """None if equal within tolerance, else a partial mismatch dict (reason, index, expected, got, counts)."""
    if not isinstance(got, torch.Tensor):
        return {"reason": "type", "detail": f"expected a tensor, got {type(got).__name__}"}
    if tuple(got.shape) != tuple(expected.shape):
        return {"reason": "shape", "expected": str(list(expected.shape)), "got": str(list(got.shape)),
                "detail": "output has the wrong shape"}
    if got.dtype != expected.dtype and not (got.is_floating_point() and expected.is_floating_point()):
        return {"reason": "dtype", "expected": str(expected.dtype), "got": str(got.dtype)}
    if expected.numel() == 0:
        return None
    rtol, atol = tol
    e = expected.detach().to(torch.float64).reshape(-1) if expected.is_floating_point() else expected.reshape(-1)
    g = got.detach().to(e.dtype).reshape(-1)
    if e.is_floating_point():
        bad = ~torch.isclose(g, e, rtol=rtol, atol=atol, equal_nan=False)
    else:
        bad = g != e
    if not bool(bad.any()):
        return None
    flat = int(bad.nonzero()[0].item())
    index = list(torch.unravel_index(torch.tensor(flat), tuple(expected.shape))) if expected.dim() else []
    reason = "nan" if g.is_floating_point() and bool(torch.isnan(g[flat])) else "value"
    return {"reason": reason, "index": [int(i) for i in index], "expected": _fmt(e[flat]), "got": _fmt(g[flat]),
            "wrong_count": int(bad.sum()), "total_count": int(e.numel())}


def first_mismatch(case: "CaseSpec", expected: list[dict[str, torch.Tensor]], outputs: list[dict[str, torch.Tensor]],
                   tol: tuple[float, float]) -> dict | None:
    for rank, (exp, out) in enumerate(zip(expected, outputs)):
        for name, e in exp.items():
            if name not in out:
                return {"case": case.name, "rank": rank, "output": name, "reason": "missing",
                        "detail": f"rank {rank} returned no output {name!r}"}
            m = compare_tensor(e, out[name], tol)
            if m:
                m.update(case=case.name, rank=rank, output=name)
                return m
    return None
