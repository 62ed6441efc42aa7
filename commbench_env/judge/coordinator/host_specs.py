"""What a `cuda` task's device host is told: its start spec (the card without cases) and each call's output shapes,
shared by the rank group that runs calls and the CUDA tools that run one call under a profiler or sanitizer."""

from __future__ import annotations

from typing import Any

from ...cards import CaseSpec


HOST = "the device host"


def host_spec(ev, timeout_s: float) -> dict[str, Any]:
    """What a device host is started with: the card without its cases (hidden shapes stay here)."""
    spec = {"card": ev.card.model_dump(mode="json"), "timeout_s": timeout_s, "landlock": ev.req.landlock,
            "device_mode": ev.req.device_mode}
    spec["card"]["cases"] = []
    return spec


def out_specs(ev, case: CaseSpec, inputs: list[dict]) -> list[dict]:
    """Per rank: each output's shape and dtype, from the golden op's expected outputs."""
    specs = []
    for exp in ev.op.expected(case, ev.world, inputs):
        specs.append({name: {"shape": list(t.shape),
                             "dtype": case.dtype if t.is_floating_point() else str(t.dtype).removeprefix("torch.")}
                      for name, t in exp.items()})
    return specs


def specs_for(ev, case: CaseSpec, seeds: list[int]) -> list[dict]:
    """`out_specs` of the inputs rank r makes from seeds[r]."""
    return out_specs(ev, case, [ev.op.make_inputs(case, r, ev.world, seeds[r]) for r in range(ev.world)])
