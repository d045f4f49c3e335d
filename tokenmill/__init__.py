"""tokenmill as a library: run a job spec, or one stage on a list of documents, from Python.

``tokenmill.run(spec)`` runs a job as ``tokenmill run`` does (without the live view) and returns its
:class:`RunResult`; ``tokenmill.apply(stage, docs)`` runs one stage in this process, without Ray, exactly as a
job runs it on each batch, and returns what it kept and dropped (:class:`Applied`). A bad spec or stage raises
:class:`SpecError` (one ``field: reason`` line per problem), a job that fails :class:`JobError`.

The stage classes are here too, for writing a stage of one's own (``docs/writing-a-stage.md``). This package is
the facade over :mod:`pipeline` (tests/test_import_graph.py): it reaches the engine through
:mod:`pipeline.job.engine` only, and nothing of ours imports it.
"""

from __future__ import annotations

from pipeline.documents import Document, Drop
from pipeline.problems import ParamError, SpecError
from pipeline.stages import DatasetStage, FilterParams, FilterStage, Stage, StageContext, StageParams, Verdict
from tokenmill.applying import Applied, Dropped, apply, stage
from tokenmill.running import JobCancelled, JobError, RunResult, run

__all__ = [
    "Applied", "DatasetStage", "Document", "Drop", "Dropped", "FilterParams", "FilterStage", "JobCancelled", "JobError",
    "ParamError", "RunResult", "SpecError", "Stage", "StageContext", "StageParams", "Verdict", "apply", "run",
    "stage",
]
