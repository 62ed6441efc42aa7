"""One interface between the coordinator and the processes that run candidate code, whatever their shape.

The coordinator (evaluation.py) owns the secret: it derives every call's seeds, regenerates the inputs, verifies
outputs and turns times into figures. A rank group only runs calls: it starts the candidate processes, hands each
call its seeds when that call is due, times it as well as its shape allows, and brings back outputs (or samples
of them) and the read-only inputs the candidate was shown. Two implementations:

- `TorchRanks` (torch_ranks.py): one forked process per rank, a torch process group between them;
- `DeviceHostRanks` (device_host_ranks.py): one device-host process that runs every rank of a `cuda` task on
  its own host thread and stream (kernels that spin on each other's flags need to run together).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...cards import CaseSpec, PerformanceSpec
from ..host.result import RankProfile, RankStatus, SanitizerReport, Violation
from .comm_model import ModelledCall
from .links import Links, Message

if TYPE_CHECKING:
    from .evaluation import Evaluation

Handed = tuple[dict, dict]  # one rank's (outputs or samples of them, read-only inputs it sent back)


@dataclass
class BenchCalls:
    """What one benchmark size's calls brought back. times[rank][timed iteration] in microseconds; samples as
    (iteration, rank, handed); `full`: whole outputs came back (for ops that verify more than sampled values)."""
    times: list[list[float]]
    samples: list[tuple[int, int, Handed]] = field(default_factory=list)
    full: bool = False
    extended: int = 0  # timed calls whose clock ran on to a device-wide sync
    bounded: bool = False  # a process's own timings were raised to the coordinator's clock floor
    modelled: list[ModelledCall] = field(default_factory=list)  # CPU: each timed call on the link model


class RankGroup(ABC):
    """The candidate processes of one evaluation, driven by its coordinator."""

    #: Whether each timed call's inputs reach the group only once the previous call is over (then no call can
    #: see a later call's inputs and the median iteration is safe to score) or calls run back-to-back (mean).
    calls_released_singly: bool

    def __init__(self, ev: "Evaluation"):
        self.ev = ev
        self.links = Links(ev.deadline, ev.timeout_s, ev.workdir, ev.card.entry.file)

    @abstractmethod
    def start(self) -> dict[int, Message]:
        """Start the processes and wait until candidate code is loaded; returns their set-up messages (sent
        before any candidate code existed: the only ones taken for the isolation report and the roofline)."""

    @abstractmethod
    def check_call(self, case: CaseSpec, seeds: list[int], inputs: list[dict]) -> list[Handed]:
        """One call of every rank on `case`, rank r's inputs made from seeds[r] (`inputs`: the coordinator's own
        copy, made from the same seeds, for what the group must know ahead, such as output shapes)."""

    @abstractmethod
    def bench_calls(self, case: CaseSpec, size: int, perf: PerformanceSpec, seeds: list[list[int]]) -> BenchCalls:
        """The warm-up and timed calls of one size, seeds[rank][iteration], each released when it is due."""

    @abstractmethod
    def profile(self, case: CaseSpec) -> tuple[list[RankProfile], SanitizerReport | None]:
        """One call under the profiler: per-rank kernel tables, and an Nsight Compute summary where one ran."""

    def stop(self, passed: bool, output_limit: int) -> tuple[list[RankStatus], list[Violation]]:
        """End every process; their states, output tails and the rules they reported broken."""
        if not self.links:
            return [], []
        self.links.shutdown()
        return self.links.statuses(passed, output_limit)
