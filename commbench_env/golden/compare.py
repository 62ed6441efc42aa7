"""Element-wise comparison that pinpoints the first wrong element."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..cards import CaseSpec


def _fmt(x: torch.Tensor) -> str:
    """Every digit the value has (a float's shortest round-trip form): 10.6423 and 10.642300000000001 differ."""
    v = x.item()
    return repr(float(v)) if isinstance(v, float) else str(v)


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
    out = {"reason": reason, "index": [int(i) for i in index], "expected": _fmt(e[flat]), "got": _fmt(g[flat]),
           "wrong_count": int(bad.sum()), "total_count": int(e.numel())}
    if e.is_floating_point():
        diff = (g - e).abs()
        allowed = atol + rtol * e.abs()
        finite = bad & torch.isfinite(diff)
        out.update(rtol=rtol, atol=atol)
        if bool(finite[flat]):
            out["abs_error"] = float(diff[flat])
            out["rel_error"] = float(diff[flat] / e[flat].abs()) if float(e[flat]) != 0.0 else None
        if bool(finite.any()):
            out["worst_tolerance_ratio"] = float((diff[finite] / allowed[finite].clamp_min(1e-300)).max())
    else:
        out["abs_error"] = float(abs(int(g[flat]) - int(e[flat])))
    return out


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
