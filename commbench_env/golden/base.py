"""Golden semantics: how a task's inputs are made, how the candidate is called, and what is correct.

One `GoldenOp` serves every task that names it. The same op object runs in two places:
- in each rank (`make_inputs` for that rank only, then `call` to invoke the candidate),
- in the coordinator (`make_inputs` for every rank, then `expected` / `verify`).
Inputs come only from a per-rank seed, so the coordinator can rebuild what every rank saw without trusting it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

import torch

if TYPE_CHECKING:
    from ..cards import CaseSpec, PerformanceSpec, TaskCard

Tensors = dict[str, torch.Tensor]
Functions = Mapping[str, Callable[..., Any]]

DTYPE_MAP: dict[str, torch.dtype] = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}


def int_param(case: "CaseSpec", key: str, default: int | None = None, low: int | None = None,
              high: int | None = None, *, optional: bool = False) -> int | None:
    """`case.params[key]` as an integer within [low, high]; None when absent and `optional` with no default. A card
    error names the parameter (cards are validated on load)."""
    v = case.params.get(key, default)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"params.{key} must be an integer, got {v!r}")
    if low is not None and v < low:
        raise ValueError(f"params.{key} must be >= {low}, got {v}")
    if high is not None and v > high:
        raise ValueError(f"params.{key} must be <= {high}, got {v}")
    return v


def bool_param(case: "CaseSpec", key: str, default: bool) -> bool:
    """`case.params[key]` as true or false."""
    v = case.params.get(key, default)
    if not isinstance(v, bool):
        raise ValueError(f"params.{key} must be true or false, got {v!r}")
    return v


def num_param(case: "CaseSpec", key: str, default: float, low: float | None = None,
              high: float | None = None) -> float:
    """`case.params[key]` as a number within [low, high]."""
    v = case.params.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"params.{key} must be a number, got {v!r}")
    if low is not None and v < low:
        raise ValueError(f"params.{key} must be >= {low}, got {v}")
    if high is not None and v > high:
        raise ValueError(f"params.{key} must be <= {high}, got {v}")
    return float(v)


def to_dtype(name: str) -> torch.dtype:
    return DTYPE_MAP[name]


def wide(t: torch.Tensor) -> torch.Tensor:
    """High-precision copy for golden arithmetic: float64 for floats, int64 for integers."""
    if t.is_floating_point():
        return t.to(torch.float64)
    return t.to(torch.int64) if t.dtype != torch.bool else t


def narrow(t: torch.Tensor, dtype: str | torch.dtype) -> torch.Tensor:
    """Golden result in the candidate's dtype family: floats stay float64 (compared with tolerance), ints exact."""
    dt = to_dtype(dtype) if isinstance(dtype, str) else dtype
    return t if dt.is_floating_point else t.to(dt)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)


RAND_CHUNK = 1 << 20  # elements: larger tensors are made in chunks of this size, each from its own generator


def elem_size(dtype: "str | torch.dtype") -> int:
    """Bytes per element of a dtype, by name or as a torch dtype."""
    dt = to_dtype(dtype) if isinstance(dtype, str) else dtype
    return dt.itemsize


def private_length(case: "CaseSpec", rank: int, world: int, g: torch.Generator) -> int:
    """A rank's private vector length: shape[0]; 0 on params.empty_rank; with params.uneven one draw of `g`, uniform
    in [0, shape[0]] (no rank can know another's)."""
    n = int(case.shape[0])
    if "empty_rank" in case.params and rank == int(case.params["empty_rank"]) % world:
        return 0
    if case.params.get("uneven"):
        return int(torch.randint(0, n + 1, (1,), generator=g))
    return n


def int_range(case: "CaseSpec") -> dict[str, int]:
    """The case's integer range as rand()'s low/high (empty: rand's default)."""
    return {"low": case.int_range[0], "high": case.int_range[1]} if case.int_range else {}


def rand(shape, dtype: str | torch.dtype, gen: torch.Generator, *, low: int = -8, high: int = 8) -> torch.Tensor:
    """Random data that is deterministic for a seed. Floats are N(0,1); integers uniform in [low, high).

    Above RAND_CHUNK elements the tensor is made in chunks, each from a generator seeded by one draw of `gen` and
    the chunk's index, on torch's intra-op threads: the values depend on the seed alone, never on the thread
    count, and a 64 MiB input takes a fraction of the serial 90 ms (every GPU benchmark call makes one per rank,
    in the device host and again in the coordinator to verify)."""
    dt = to_dtype(dtype) if isinstance(dtype, str) else dtype
    shape = tuple(int(s) for s in shape)
    numel = math.prod(shape)
    if numel > RAND_CHUNK:
        return _chunked_rand(shape, numel, dt, gen, low, high)
    return _rand_into(torch.empty(shape, dtype=_draw_dtype(dt)), dt, gen, low, high).to(dt)


def _draw_dtype(dt: torch.dtype) -> torch.dtype:
    if dt.is_floating_point:
        return dt if dt in (torch.float32, torch.float64) else torch.float32
    return torch.int64


def _rand_into(out: torch.Tensor, dt: torch.dtype, gen: torch.Generator, low: int, high: int) -> torch.Tensor:
    if dt.is_floating_point:
        return out.normal_(generator=gen)
    if dt == torch.bool:
        return out.random_(0, 2, generator=gen)
    return out.random_(low, high, generator=gen)


def _chunked_rand(shape: tuple[int, ...], numel: int, dt: torch.dtype, gen: torch.Generator, low: int,
                  high: int) -> torch.Tensor:
    from concurrent.futures import ThreadPoolExecutor

    base = int(torch.randint(0, 1 << 62, (1,), generator=gen))
    flat = torch.empty(numel, dtype=_draw_dtype(dt))
    chunks = range(-(-numel // RAND_CHUNK))

    def fill(i: int) -> None:
        g = generator(base ^ (0x9E37_79B9_7F4A_7C15 * (i + 1) & 0x7FFF_FFFF_FFFF_FFFF))
        _rand_into(flat[i * RAND_CHUNK:(i + 1) * RAND_CHUNK], dt, g, low, high)

    threads = max(1, min(len(chunks), torch.get_num_threads(), 16))
    if threads == 1:
        for i in chunks:
            fill(i)
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="rand") as pool:
            list(pool.map(fill, chunks))
    return flat.to(dt).reshape(shape)


class CandidateError(Exception):
    """The candidate broke the calling convention (wrong return type, shape...). Message goes to the agent."""


def expect_tensor(value: Any, what: str) -> torch.Tensor:
    # exact type: a Tensor subclass could override the harness's own tensor operations
    if type(value) is not torch.Tensor:
        raise CandidateError(f"{what} must be a torch.Tensor, got {type(value).__name__}")
    return value


class GoldenOp:
    """Base class of golden semantics. Subclasses set `name` and implement the four core methods."""

    name: ClassVar[str] = ""
    #: nccl-tests op whose bus-bandwidth factor applies ("all_reduce", "all_gather", ..., or None = 1)
    nccl_op: ClassVar[str | None] = None
    #: the candidate functions this op calls
    functions: ClassVar[tuple[str, ...]] = ()
    #: collective kinds (judge/coordinator/fabric.py's KIND_METHODS) the harness itself runs for the candidate (an
    #: all_reduce it hands over): the CPU fabric carries them even where the card forbids them to the candidate
    harness_collectives: ClassVar[frozenset[str]] = frozenset()

    # ---- card validation -------------------------------------------------------------------------
    def validate_card(self, card: "TaskCard") -> None:
        """Raise ValueError("field 'x': ...") when the card does not fit this op."""
        missing = [f for f in self.functions if f not in card.entry.functions]
        if missing:
            raise ValueError(f"field 'entry.functions': op {self.name!r} calls {missing}, which the card does not declare")
        for i, case in enumerate(card.cases):
            try:
                self.validate_case(case)
            except ValueError as exc:
                raise ValueError(f"field 'cases.{i}' ({case.name}): {exc}") from None

    def validate_case(self, case: "CaseSpec") -> None:
        """Check one case's shape and params; default: nothing to check."""

    def supports_world(self, world: int, case: "CaseSpec") -> bool:
        return True

    # ---- rank side -------------------------------------------------------------------------------
    def make_inputs(self, case: "CaseSpec", rank: int, world: int, seed: int) -> Tensors:
        """This rank's inputs, from its private seed alone."""
        raise NotImplementedError

    def call(self, fns: Functions, inputs: Tensors, case: "CaseSpec", rank: int, world: int) -> Tensors:
        """Invoke the candidate on this rank's inputs and return its outputs by name."""
        raise NotImplementedError

    def candidate_inputs(self, inputs: Tensors) -> Tensors:
        """The inputs the candidate may see (others, such as secret per-rank transforms, stay in the harness)."""
        return {k: v for k, v in inputs.items() if not k.startswith("secret_")}

    # ---- coordinator side ------------------------------------------------------------------------
    def expected(self, case: "CaseSpec", world: int, inputs: list[Tensors]) -> list[Tensors]:
        """The correct outputs of every rank, computed in high precision."""
        raise NotImplementedError

    def expected_samples(self, case: "CaseSpec", world: int, inputs: list[Tensors],
                         pick: Callable[[int, str, int], torch.Tensor]) -> list[Tensors] | None:
        """The correct outputs at a few positions only, for checking samples of timed calls; None: not supported,
        the coordinator then computes `expected` in full and indexes it.

        `pick(rank, name, numel)` returns the flat positions of output `name` of `rank` (whose size is `numel`) to
        compute. Call it for every rank and every output, in sorted name order within a rank: the rank drew its
        samples in that order. Return, per rank, name -> the values at those positions (as `expected` would give)."""
        return None

    def verifies_whole_outputs(self) -> bool:
        """Whether this op checks more than values at positions (it has its own `verify`): then the outputs of
        timed calls must come back whole, not sampled."""
        return type(self).verify is not GoldenOp.verify

    def verify(self, case: "CaseSpec", world: int, inputs: list[Tensors], outputs: list[Tensors],
               tol: tuple[float, float]) -> "dict | None":
        """First mismatch as a dict for `Mismatch`, or None. Default: compare against `expected`."""
        from .compare import first_mismatch

        return first_mismatch(case, self.expected(case, world, inputs), outputs, tol)

    # ---- benchmark -------------------------------------------------------------------------------
    def size_case(self, perf: "PerformanceSpec", size_bytes: int, world: int) -> "CaseSpec":
        """The case that benchmarks `size_bytes` (the nccl-tests size). Default: a flat tensor of that many bytes."""
        from ..cards import CaseSpec

        elem = torch.empty((), dtype=to_dtype(perf.dtype)).element_size()
        count = max(1, size_bytes // elem)
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[count], dtype=perf.dtype,
                        params=dict(perf.params))

    def metric_bytes(self, case: "CaseSpec", world: int) -> int:
        """nccl-tests 'size' of a case in bytes (what algbw divides)."""
        return math.prod(case.shape) * torch.empty((), dtype=to_dtype(case.dtype)).element_size()

    def flops(self, case: "CaseSpec", world: int) -> float:
        """Floating-point operations per rank per call, for tflops-metric tasks; 0 when not meaningful."""
        return 0.0
