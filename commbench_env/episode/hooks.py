"""Episode hooks: what watches an episode without changing it. The episode core builds one typed record per event
(trace/records.py) and hands it to each hook in order; the trace file is one such hook (`TraceRecorder`, always
first), and a caller adds its own (`Episode(hooks=[...])`, or `CommBenchEnv(hooks=[...])`), e.g. to stream turns to
a dashboard or a trainer's logger. A hook that raises fails the step: hooks are the caller's own code."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..trace.records import EpisodeEnd, EpisodeStart, TraceStep, TraceWriter

if TYPE_CHECKING:
    from .core import Episode, StepOutcome


class EpisodeHook:
    """Override what you need; every method is called from the thread that plays the episode (`on_end` may come
    from another one when a run is being stopped)."""

    def on_start(self, episode: Episode, record: EpisodeStart) -> None:
        """An episode began (its trace path is `episode.trace_path`)."""

    def on_step(self, episode: Episode, outcome: StepOutcome, record: TraceStep) -> None:
        """A turn was played: `outcome` is the host's typed view (full result), `record` what the trace keeps."""

    def on_end(self, episode: Episode, record: EpisodeEnd) -> None:
        """The episode ended, finished or interrupted (`record.status`); called once per episode."""


class TraceRecorder(EpisodeHook):
    """Writes each record to the episode's JSONL trace as it happens (flushed and fsynced: a crash keeps every
    finished turn)."""

    def __init__(self) -> None:
        self._writer: TraceWriter | None = None

    def on_start(self, episode: Episode, record: EpisodeStart) -> None:
        self._writer = TraceWriter(episode.trace_path)  # type: ignore[arg-type]
        self._writer.write(record)

    def on_step(self, episode: Episode, outcome: StepOutcome, record: TraceStep) -> None:
        if self._writer is not None:
            self._writer.write(record)

    def on_end(self, episode: Episode, record: EpisodeEnd) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.write(record)
            writer.close()
