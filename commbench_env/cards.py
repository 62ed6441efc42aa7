"""Task cards: the typed schema of `tasks/<category>/<name>/task.toml`, loading, validation and hashing."""

from __future__ import annotations

import hashlib
import math
from enum import Enum
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .config import StrictModel, load_model, read_toml
from .errors import CardError, NotFoundError
from .judge.link_model import LINK_MODELS, LinkModel
from .paths import CUDA_HEADER_DIR, tasks_dir

CARD_FILE = "task.toml"
PROMPT_FILE = "prompt.md"
HINTS_FILE = "hints.md"  # optional design advice, shown only at the hints level


class Category(str, Enum):
    p2p = "p2p"
    collective = "collective"
    ep = "ep"
    fusion = "fusion"
    utility = "utility"


class Difficulty(str, Enum):
    easy = "easy"
    medium = "medium"
    hard = "hard"


class Language(str, Enum):
    torch = "torch"
    cuda = "cuda"
    triton = "triton"


class DeviceMode(str, Enum):
    cpu = "cpu"
    cuda = "cuda"
    cuda_shared = "cuda-shared"


DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool")


class EntrySpec(StrictModel):
    """The file the candidate writes and the functions it must define in it."""

    file: str = "solution.py"
    functions: list[str] = Field(min_length=1)
    starter: str = "starter.py"
    reference: str = "reference.py"


class WorldSpec(StrictModel):
    sizes: list[int] = Field(default_factory=lambda: [2, 4])
    default: int | None = None
    device_modes: list[DeviceMode] = Field(default_factory=lambda: [DeviceMode.cpu])
    min_gpus: int = 0
    needs: list[Literal["nccl", "ipc", "nvshmem", "nvlink", "rdma"]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> "WorldSpec":
        if not self.sizes or any(s < 1 for s in self.sizes):
            raise ValueError("sizes must be a non-empty list of positive integers")
        if self.default is not None and self.default not in self.sizes:
            raise ValueError(f"default {self.default} is not one of sizes {self.sizes}")
        return self

    @property
    def default_size(self) -> int:
        return self.default if self.default is not None else self.sizes[0]


class RulesSpec(StrictModel):
    """What the candidate may not use. Names are dotted (torch.distributed.all_reduce) or a preset (@collectives)."""

    forbidden_apis: list[str] = Field(default_factory=list)
    extra_imports: list[str] = Field(default_factory=list, description="modules allowed beyond the default set")
    inputs_read_only: bool = True


class SemanticsSpec(StrictModel):
    op: str
    params: dict[str, Any] = Field(default_factory=dict)


class CaseSpec(StrictModel):
    """One correctness case. `shape` and `params` are interpreted by the task's golden op."""

    name: str
    visible: bool = True
    shape: list[int] = Field(default_factory=list)
    dtype: str = "float32"
    params: dict[str, Any] = Field(default_factory=dict)
    int_range: list[int] | None = Field(default=None, description="[low, high) of integer inputs where the op draws "
                                        "them at random (default [-8, 8)): a wide range stresses exact integer "
                                        "arithmetic, e.g. sums that float32 would round")

    @field_validator("int_range")
    @classmethod
    def _int_range(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (len(v) != 2 or v[0] >= v[1]):
            raise ValueError(f"int_range {v} must be [low, high] with low < high")
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        if v not in DTYPES:
            raise ValueError(f"unknown dtype {v!r}; expected one of {', '.join(DTYPES)}")
        return v

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: list[int]) -> list[int]:
        if any(d < 0 for d in v):
            raise ValueError(f"shape {v} has a negative dimension; dimensions are >= 0")
        return v

    def signature(self) -> tuple:
        return (tuple(self.shape), self.dtype, tuple(sorted((k, repr(v)) for k, v in self.params.items())),
                tuple(self.int_range or ()))


class Tolerance(StrictModel):
    rtol: float = 0.0
    atol: float = 0.0


DEFAULT_TOLERANCE: dict[str, Tolerance] = {
    "float64": Tolerance(rtol=1e-9, atol=1e-9),
    "float32": Tolerance(rtol=1e-4, atol=1e-5),
    "float16": Tolerance(rtol=1e-2, atol=1e-2),
    "bfloat16": Tolerance(rtol=2e-2, atol=2e-2),
}


class PerformanceSpec(StrictModel):
    """How `benchmark` measures: sizes are the nccl-tests 'size' in bytes of the op. On a GPU every timed call
    starts from a cold L2 (the judge's warm-up before each start line streams far more than the L2 holds)."""

    metric: Literal["busbw", "algbw", "latency", "tflops"] = "busbw"
    sizes: list[int] = Field(min_length=1)
    dtype: str = "float32"
    warmup: int = Field(default=2, ge=0)
    iters: int = Field(default=5, ge=1)
    gpu_sizes: list[int] | None = Field(default=None, description="sizes used in the cuda device modes (default: sizes)")
    gpu_warmup: int = Field(default=5, ge=0, description="warm-up calls per size in the cuda modes (nccl-tests -w)")
    gpu_iters: int = Field(default=20, ge=1, description="timed calls per size in the cuda modes (nccl-tests -n): "
                                                         "the median of 5 calls moved rewards by 0.04 between runs")
    roofline_bound: float | dict[int, float] = Field(
        default=1.0, description="the share of the measured roofline (copy or link bandwidth) the task's metric can "
        "reach at best, where its protocol must move more bytes than the metric counts (an LL line: 8 bytes stored "
        "per 4 of data); roofline_pct is against roofline x bound. A table keyed by world size where the share "
        "depends on it (a two-shot all-reduce on one GPU: 2/3 at 2 ranks, 1 from 4): it must name every world size")
    roofline_reason: str = Field(default="", description="why roofline_bound is below 1, shown with the figures")
    link_model: str | None = Field(default=None, description="a preset of judge/link_model.py's LINK_MODELS that CPU "
                                   "evaluations of this task model instead of the sandbox profile's, where the "
                                   "problem is set on other hardware (a cluster whose messages cost more than "
                                   "their bytes); the prompt states it")

    @model_validator(mode="after")
    def _bound_has_reason(self) -> "PerformanceSpec":
        bounds = self.roofline_bound.values() if isinstance(self.roofline_bound, dict) else [self.roofline_bound]
        if not bounds:
            raise ValueError("roofline_bound is an empty table: give one share, or one per world size")
        if any(not 0 < b <= 1 for b in bounds):
            raise ValueError(f"roofline_bound must lie in (0, 1]; got {self.roofline_bound}")
        if min(bounds, default=1) < 1 and not self.roofline_reason.strip():
            raise ValueError("roofline_bound below 1 needs a roofline_reason saying why")
        if self.link_model is not None and self.link_model not in LINK_MODELS:
            raise ValueError(f"link_model {self.link_model!r} is not a preset; choose one of {sorted(LINK_MODELS)}")
        return self

    def bound_at(self, world: int) -> float:
        """The roofline share this task can reach at `world` ranks (the card's table, or its one number). Tests
        and studies may judge a world the card does not list: that takes the nearest named world's bound."""
        if isinstance(self.roofline_bound, dict):
            return self.roofline_bound[min(self.roofline_bound, key=lambda w: (abs(w - world), w))]
        return self.roofline_bound

    @field_validator("sizes", "gpu_sizes")
    @classmethod
    def _sizes(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(n < 0 for n in v):
            raise ValueError(f"sizes {v} has a negative size; sizes are byte counts >= 0")
        return v

    def sizes_for(self, device_mode: str) -> list[int]:
        return self.gpu_sizes if device_mode != "cpu" and self.gpu_sizes else self.sizes

    def for_device(self, device_mode: str) -> "PerformanceSpec":
        """This spec as measured in `device_mode`: on a GPU, nccl-tests' warm-up and iteration counts."""
        if device_mode == "cpu":
            return self
        return self.model_copy(update={"warmup": self.gpu_warmup, "iters": self.gpu_iters})
    params: dict[str, Any] = Field(default_factory=dict)


class CudaSpec(StrictModel):
    """How the judge calls a `cuda` candidate through `cb_args` (commbench_env/judge/cuda/commbench.h)."""

    arch: str = Field(default="sm_90", description="nvcc -arch when no GPU is present to detect it from")
    links: list[str] = Field(default_factory=list, description="libraries the candidate may link (nccl, nvshmem, ...); "
                             "each also allows its own symbols (nccl*, nvshmem*, ...)")
    allow_symbols: list[str] = Field(default_factory=list, description="symbols the library may import beyond the "
                                     "judge's default allowlist (judge/coordinator/cuda_build.py): exact names, or `prefix*`")
    nvcc_flags: list[str] = Field(default_factory=list)
    input: str = Field(default="x", description="the op input placed in cb_args.in")
    output: str = Field(default="y", description="the op output read from cb_args.out")
    aux_inputs: list[str] = Field(default_factory=list, description="op inputs placed in cb_args.aux_in[i]")
    aux_outputs: list[str] = Field(default_factory=list, description="op outputs read from cb_args.aux_out[i]")
    params: list[str] = Field(default_factory=list, description="case.params keys passed as cb_args.params[i]")
    scratch_bytes: int = Field(default=1 << 20, ge=0)
    scratch_per_input: float = Field(default=0.0, ge=0, description="extra scratch, in multiples of the input bytes")
    flag_words: int = Field(default=4096, ge=1)
    peer_buffers: list[Literal["in", "out", "scratch", "flags"]] = Field(
        default_factory=lambda: ["in", "out", "scratch", "flags"],
        description="which buffers of other ranks the candidate gets pointers to; args->peer_<name>[p] is NULL for "
                    "p != rank otherwise, so that (for instance) a rank's input reaches its peers only through what "
                    "the rank itself sends")
    peer_groups: str | None = Field(default=None, description="a case parameter g (also listed in `params`): ranks "
                                    "form groups of g consecutive ranks, and args->peer_*[p] is non-NULL only for "
                                    "p in this rank's group or p its counterpart in another group (p % g == rank "
                                    "% g), so a two-level schedule is the only one the pointers allow")

    @model_validator(mode="after")
    def _groups_are_passed(self) -> "CudaSpec":
        if self.peer_groups is not None and self.peer_groups not in self.params:
            raise ValueError(f"[cuda] peer_groups {self.peer_groups!r} must also be in [cuda] params, so the "
                             "candidate learns the group size")
        return self

    @field_validator("allow_symbols")
    @classmethod
    def _check_symbols(cls, v: list[str]) -> list[str]:
        import re

        bad = [x for x in v if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{2,}\*?", x)]
        if bad:
            raise ValueError(f"[cuda] allow_symbols: {bad} are not symbol names (or `prefix*`, 3 characters or more)")
        return v


class LimitsSpec(StrictModel):
    timeout_s: float = Field(default=60.0, gt=0, description="wall-clock limit of one whole evaluation")
    case_timeout_s: float | None = Field(default=None, gt=0, description="limit of one correctness case (a "
                                         "deadlock costs this, not the whole limit); default a quarter of "
                                         "timeout_s, at least 10 s")
    memory_mb: int | None = Field(default=None, description="address-space limit per rank; profile default if unset")

    @property
    def case_limit_s(self) -> float:
        return self.case_timeout_s or max(10.0, self.timeout_s / 4)


class TaskCard(StrictModel):
    id: str
    title: str
    category: Category
    difficulty: Difficulty
    tags: list[str] = Field(default_factory=list)
    source: str = ""
    language: Language = Language.torch
    entry: EntrySpec
    world: WorldSpec = Field(default_factory=WorldSpec)
    rules: RulesSpec = Field(default_factory=RulesSpec)
    semantics: SemanticsSpec
    cases: list[CaseSpec] = Field(min_length=1)
    tolerance: dict[str, Tolerance] = Field(default_factory=dict)
    performance: PerformanceSpec
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    cuda: CudaSpec | None = None

    @model_validator(mode="after")
    def _check_language(self) -> "TaskCard":
        if self.language == Language.cuda:
            if self.cuda is None:
                self.cuda = CudaSpec()
            if not self.entry.file.endswith(".cu"):
                raise ValueError("entry.file of a cuda task must be a .cu file")
            if DeviceMode.cpu in self.world.device_modes:
                raise ValueError("world.device_modes: a cuda task cannot run in device mode 'cpu'")
        elif self.cuda is not None:
            raise ValueError("a [cuda] section is only for language = 'cuda'")
        bound = self.performance.roofline_bound
        if isinstance(bound, dict) and set(self.world.sizes) - set(bound):
            raise ValueError(f"performance.roofline_bound names worlds {sorted(bound)} but not "
                             f"{sorted(set(self.world.sizes) - set(bound))}: give a bound for every world size")
        return self

    @model_validator(mode="after")
    def _check_cases(self) -> "TaskCard":
        names = [c.name for c in self.cases]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"case names must be unique; repeated: {sorted(dup)}")
        visible = [c for c in self.cases if c.visible]
        hidden = [c for c in self.cases if not c.visible]
        if not visible:
            raise ValueError("at least one case must be visible (the prompt shows it)")
        if not hidden:
            raise ValueError("at least one case must be hidden (visible = false)")
        seen = {c.signature() for c in visible}
        for c in hidden:
            if c.signature() in seen:
                raise ValueError(f"hidden case {c.name!r} has the same shape, dtype and params as a visible one")
            if tuple(c.shape) in {tuple(v.shape) for v in visible}:
                raise ValueError(f"hidden case {c.name!r} must differ in shape from every visible case")
        return self

    def tolerance_for(self, dtype: str) -> Tolerance:
        if dtype in self.tolerance:
            return self.tolerance[dtype]
        return DEFAULT_TOLERANCE.get(dtype, Tolerance())

    def visible_cases(self) -> list[CaseSpec]:
        return [c for c in self.cases if c.visible]


class Task:
    """A loaded task: its card, the files around it and the content hash of all of them."""

    def __init__(self, card: TaskCard, root: Path):
        self.card = card
        self.root = root
        self.prompt = _card_text(root / PROMPT_FILE, ascii_only=True)
        self.hints = _card_text(root / HINTS_FILE, ascii_only=True) if (root / HINTS_FILE).is_file() else ""
        self.starter = _card_text(root / card.entry.starter)
        self._reference_path = root / card.entry.reference
        self.hash = _hash_dir(root)

    @property
    def id(self) -> str:
        return self.card.id

    def reference_source(self) -> str:
        """The expert solution. Host-side only: never written into a candidate's sandbox."""
        return self._reference_path.read_text()

    def link_model(self, profile_model: LinkModel) -> LinkModel:
        """The fabric this task's CPU evaluations model: the card's preset where it names one, else the profile's."""
        name = self.card.performance.link_model
        return LINK_MODELS[name] if name else profile_model

    def unsupported(self, mode: str) -> str | None:
        """Why this task cannot serve judge `mode` (the agent's slip, answered without a judge run), or None."""
        lang = self.card.language.value
        if mode == "sanitize" and lang != "cuda":
            return (f"sanitize runs compute-sanitizer on CUDA tasks only; this task is written in {lang}, so "
                    "nothing was run. Use check, benchmark or profile.")
        return None

    def world_for(self, requested: int | None) -> int:
        """The requested world size where this task allows it, else its default."""
        sizes = self.card.world.sizes
        return requested if requested is not None and requested in sizes else self.card.world.default_size

    def judge_spec(self) -> dict[str, Any]:
        """Everything the judge needs, hidden cases included; sent to it over stdin, never as a file."""
        return {"card": self.card.model_dump(mode="json"), "task_hash": self.hash}

    def agent_view(self, hints: bool = False, check_worlds: int = 2) -> str:
        """Exactly the text the agent sees at reset: statement, signature, rules, visible cases, starter; with
        `hints`, the task's design advice (hints.md) after the statement. The statement alone is the problem: what
        is computed, the rules, sizes, dtypes, tolerances and what is checked, never the algorithm."""
        c = self.card
        lines = [f"# {c.title}", f"task: {c.id}  ({c.category.value}, {c.difficulty.value}, language: {c.language.value})", ""]
        lines.append(self.prompt.strip())
        if hints and self.hints.strip():
            lines += ["", "## Hints", self.hints.strip()]
        lines += ["", "## Rules"]
        lines.append(f"- Write the file `{c.entry.file}` defining: {', '.join(c.entry.functions)}.")
        if c.rules.forbidden_apis:
            from .judge.rules import COLLECTIVE_PACKAGES, PRESETS

            named = []
            for name in c.rules.forbidden_apis:
                if name in PRESETS:  # say what a preset stands for: an agent cannot know what '@p2p' covers
                    packages = [x for x in PRESETS[name] if x in COLLECTIVE_PACKAGES]
                    funcs = [x for x in PRESETS[name] if x not in packages]
                    text = "torch.distributed." + "/".join(f.rsplit(".", 1)[1] for f in funcs)
                    named.append(f"{name} ({text}" + (f", and anything in {', '.join(packages)}" if packages else "")
                                 + ")")
                else:
                    named.append(name)
            lines.append(f"- Forbidden: {'; '.join(named)} (checked statically and at run time).")
        if c.language == Language.cuda:
            links = ", ".join(c.cuda.links) if c.cuda and c.cuda.links else "none beyond the CUDA runtime"
            lines.append("- Include \"commbench.h\" and declare each entry point as "
                         "`CB_ENTRY name(const cb_args* args, cudaStream_t stream)`; enqueue work on `stream`, return 0.")
            lines.append(f"- Libraries you may link: {links}. No loaders, processes, files or sockets.")
            hidden = [b for b in ("in", "out", "scratch", "flags") if c.cuda and b not in c.cuda.peer_buffers]
            if hidden:
                names = " and ".join(f"`args->peer_{b}[p]`" for b in hidden)
                lines.append(f"- {names} {'is' if len(hidden) == 1 else 'are'} NULL for every p != rank: those "
                             f"buffers of other ranks are private to them.")
            if c.cuda and c.cuda.peer_groups:
                g = c.cuda.peer_groups
                i = c.cuda.params.index(g)
                lines.append(f"- Ranks form groups of g = `args->params[{i}]` ({g}) consecutive ranks; every "
                             f"`args->peer_*[p]` is NULL unless p is in this rank's group (p / g == rank / g) or is "
                             f"its counterpart in another group (p % g == rank % g).")
        else:
            from .judge.rules import ALLOWED_IMPORTS

            allowed = sorted(ALLOWED_IMPORTS - {"__future__"}) + list(c.rules.extra_imports)
            lines.append(f"- Imports allowed: {', '.join(allowed)} (torch includes torch.distributed).")
            lines.append("- No file, process, socket or introspection APIs; data between ranks must travel through "
                         "torch.distributed.")
            lines.append("- On GPUs, work on the current CUDA stream: making or switching streams (torch.cuda.Stream, "
                         "torch.cuda.stream, CUDA graphs) is not allowed; overlap communication with compute through "
                         "async_op=True and wait().")
        if c.rules.inputs_read_only:
            lines.append("- Inputs are read-only: do not modify them.")
        lines.append(f"- World sizes: {', '.join(str(s) for s in c.world.sizes)}; device modes: {', '.join(m.value for m in c.world.device_modes)}.")
        lines.append("- Checked: every case's outputs on every rank, element by element"
                     + ("; code that passes is checked again at another of these world sizes." if check_worlds > 1
                        and len(c.world.sizes) > 1 else "."))
        floats = sorted({case.dtype for case in c.cases if case.dtype in DEFAULT_TOLERANCE or case.dtype in c.tolerance})
        if floats:
            tols = "; ".join(f"{d}: rtol {c.tolerance_for(d).rtol:g}, atol {c.tolerance_for(d).atol:g}" for d in floats)
            lines.append(f"- Tolerance: |got - expected| <= atol + rtol * |expected|, per dtype ({tols}). "
                         "Integer and bool outputs must be exact.")
        else:
            lines.append("- Outputs must be exact.")
        lines += ["", "## Visible cases (hidden cases of other shapes and sizes are checked too)"]
        for case in c.visible_cases():
            extra = f" params={case.params}" if case.params else ""
            lines.append(f"- {case.name}: shape={case.shape} dtype={case.dtype}{extra}")
        p = c.performance
        lines += ["", "## Performance",
                  f"- metric: {p.metric}; sizes (bytes): {', '.join(_fmt_bytes(s) for s in p.sizes)}; dtype {p.dtype}."]
        if p.metric in ("busbw", "algbw"):
            lines.append("- algbw = size / time and busbw = algbw x the operation's bus factor, as nccl-tests defines "
                         "them (2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for "
                         "broadcast and point-to-point; n = world size).")
        if DeviceMode.cpu in c.world.device_modes:
            fabric = LINK_MODELS[p.link_model] if p.link_model else None
            lines.append("- In device mode cpu the time is modelled, not measured: the judge carries every message "
                         "and times the messages your ranks post, in their order and with their dependencies, on "
                         + (f"{fabric.description}." if fabric else "the sandbox profile's link model (by "
                            f"default {LinkModel().description}).")
                         + " A message holds its sender's and its receiver's port for its bytes, and its sender's "
                           "for the per-message cost; library collectives cost what NCCL's ring costs there.")
        if p.gpu_sizes:
            lines.append(f"- on GPUs the sizes are {', '.join(_fmt_bytes(s) for s in p.gpu_sizes)}.")
        if c.language == Language.cuda:
            lines += ["", "## commbench.h (the calling convention)", "```c",
                      (CUDA_HEADER_DIR / "commbench.h").read_text().rstrip(), "```"]
        fence = "cuda" if c.language == Language.cuda else "python"
        lines += ["", f"## Starter: {c.entry.file}", f"```{fence}", self.starter.rstrip(), "```"]
        return "\n".join(lines) + "\n"


def _card_text(path: Path, ascii_only: bool = False) -> str:
    """A text file of a task, or a CardError naming it: not UTF-8, or (prompts) not ASCII, which the observation
    space cannot carry."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CardError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise CardError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    if ascii_only:
        bad = next((i for i, c in enumerate(text) if ord(c) > 126 or (ord(c) < 32 and c not in "\n\t")), None)
        if bad is not None:
            line = text.count("\n", 0, bad) + 1
            raise CardError(f"{path}: line {line} holds {text[bad]!r}; prompts are printable ASCII (the observation "
                            "space is), so write it as ASCII")
    return text


def _fmt_bytes(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def _hash_dir(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def load_task_dir(root: Path) -> Task:
    path = root / CARD_FILE
    data = read_toml(path)
    card = load_model(TaskCard, data, path)
    expected_id = "/".join(root.parts[-2:])
    if card.id != expected_id:
        raise CardError(f"{path}: field 'id': is {card.id!r} but the folder says {expected_id!r}")
    if card.category.value != root.parts[-2]:
        raise CardError(f"{path}: field 'category': is {card.category.value!r} but the task lives under {root.parts[-2]!r}/")
    for field, name in (("entry.starter", card.entry.starter), ("entry.reference", card.entry.reference)):
        if not (root / name).is_file():
            raise CardError(f"{path}: field '{field}': file {name!r} not found next to the card")
    if not (root / PROMPT_FILE).is_file():
        raise CardError(f"{path}: {PROMPT_FILE} is missing next to the card")
    from .golden import get_op  # late import: golden imports torch

    try:
        op = get_op(card.semantics.op)
    except KeyError as exc:
        raise CardError(f"{path}: field 'semantics.op': {exc.args[0]}") from None
    try:
        op.validate_card(card)
    except ValueError as exc:
        raise CardError(f"{path}: {exc}") from None
    return Task(card, root)


@lru_cache(maxsize=None)
def _all_task_dirs(base: str) -> tuple[Path, ...]:
    return tuple(sorted(p.parent for p in Path(base).glob(f"*/*/{CARD_FILE}")))


def load_task(task_id: str, base: Path | None = None) -> Task:
    base = base or tasks_dir()
    root = base / task_id
    if not (root / CARD_FILE).is_file():
        known = ", ".join(list_task_ids(base)[:8])
        raise NotFoundError(f"no task {task_id!r} under {base}; known tasks include: {known} (see `commbench tasks`)")
    return load_task_dir(root)


def list_task_ids(base: Path | None = None) -> list[str]:
    base = base or tasks_dir()
    return ["/".join(p.parts[-2:]) for p in _all_task_dirs(str(base))]


def load_all_tasks(base: Path | None = None) -> list[Task]:
    """Every task that loads; broken cards are left out (`broken_tasks` lists them)."""
    return [t for t in (_try_load(i, base) for i in list_task_ids(base)) if t is not None]


def broken_tasks(base: Path | None = None, ids: list[str] | None = None) -> dict[str, str]:
    """Task id -> why its card does not load (the file and field), for every broken card (of `ids`, if given)."""
    out = {}
    for task_id in list_task_ids(base) if ids is None else ids:
        try:
            load_task(task_id, base)
        except CardError as exc:
            out[task_id] = str(exc)
    return out


def _try_load(task_id: str, base: Path | None) -> Task | None:
    try:
        return load_task(task_id, base)
    except CardError:
        return None


def selected_ids(selector: str | None = None, base: Path | None = None) -> tuple[list[str], set[str]]:
    """The task ids a selector ('all', 'smoke', an id, a category, or a comma list / glob of ids) picks, in order
    and without repeats, and those of them it names by id. No card is loaded."""
    import fnmatch

    ids = list_task_ids(base)
    chosen: list[str]
    named: set[str] = set()
    if not selector or selector == "all":
        chosen = ids
    else:
        chosen = []
        for part in selector.split(","):
            part = part.strip()
            if part == "smoke":
                chosen += [i for i in SMOKE_SET if i in ids]
            elif part in {c.value for c in Category}:
                chosen += [i for i in ids if i.startswith(part + "/")]
            elif any(ch in part for ch in "*?["):
                chosen += fnmatch.filter(ids, part)
            elif part in ids:
                chosen.append(part)
                named.add(part)
            else:
                raise NotFoundError(f"task selector {part!r} matches nothing; try `commbench tasks`")
    return list(dict.fromkeys(chosen)), named


def select_tasks(selector: str | None = None, *, category: str | None = None, difficulty: str | None = None,
                 language: str | None = None, device_mode: str | None = None, base: Path | None = None) -> list[Task]:
    """Tasks matching a selector (see `selected_ids`) and filters."""
    chosen, named = selected_ids(selector, base)
    tasks = [t for i in chosen if (t := load_task(i, base) if i in named else _try_load(i, base)) is not None]
    out = []
    for t in tasks:
        c = t.card
        if category and c.category.value != category:
            continue
        if difficulty and c.difficulty.value != difficulty:
            continue
        if language and c.language.value != language:
            continue
        if device_mode and device_mode not in {m.value for m in c.world.device_modes}:
            continue
        out.append(t)
    return out


# One task per category: the default set `commbench run` plays.
SMOKE_SET = (
    "p2p/ring_shift",
    "collective/allreduce_ring",
    "ep/moe_dispatch_combine",
    "fusion/allgather_matmul",
    "utility/barrier_p2p",
)


def busbw_factor(nccl_op: str | None, world: int) -> float:
    """nccl-tests bus-bandwidth factor for an op (PERFORMANCE.md of nccl-tests)."""
    n = world
    if nccl_op == "all_reduce":
        return 2 * (n - 1) / n
    if nccl_op in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def bus_share_of_copy(nccl_op: str | None, world: int) -> float:
    """Of the bytes a rank writes in one call, the share that busbw counts.

    Out-of-place all-gather and all-to-all also copy the rank's own block, which busbw leaves out. On a real mesh
    that copy stays in the GPU's own memory, off the links; in `cuda-shared` it takes the same copy bandwidth as
    the peers' blocks, so a rank's busbw can reach only this share of its part of the device copy bandwidth."""
    if nccl_op in ("all_gather", "alltoall"):
        return (world - 1) / world
    return 1.0


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0
