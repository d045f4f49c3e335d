"""What a :class:`~pipeline.stages.base.DatasetStage` reports through: the recorder the runner hands to ``apply``.

A Protocol, not the job's class: a stage module must not import the job engine (the engine imports the
stages), and a test may pass its own recorder. The job's :class:`pipeline.job.stats.StageRecorder` is the one
the runner passes; it is picklable, so a stage hands it on to its Ray tasks, which report from there.
"""

from __future__ import annotations

from typing import Any, Protocol

from pipeline.stages.metrics import StageMetrics

#: a dropped row as a dataset stage hands it over: the document's fields plus ``reason`` and optional ``detail``
RejectRow = dict[str, Any]


class Recorder(Protocol):
    """Counts and drops of one stage, reported from the driver or from the stage's Ray tasks.

    Each report is named by ``key`` (else by the running Ray task and the report's place in it), so a batch
    Ray runs again after losing a worker is counted once and its rejected file written once.
    """

    #: when the phase started (wall clock), None outside a job: a worker started after it counts its
    #: process's start in the seconds of the first stage that runs in it
    phase_started: float | None

    def counts(self, key: str | None = None, *, docs_in: int = 0, docs_out: int = 0,
               dropped: dict[str, int] | None = None, bytes_in: int = 0, bytes_out: int = 0, seconds: float = 0.0,
               metrics: StageMetrics | None = None) -> None:
        """Report one batch's counts (or only ``seconds`` of work that counts no documents)."""

    def rejects(self, rows: list[RejectRow], key: str | None = None, *, sampled: bool = True) -> None:
        """Write dropped rows to ``rejected/`` (each carries ``reason``, may carry ``detail`` and ``kept_id``)."""

    def driver_gap(self, step: str) -> None:
        """On the driver, where no task runs: count the workers' wait since the last report as ``step``."""
