"""``tokenmill.run(spec)``: one job, as ``tokenmill run`` runs it, for a script or a notebook."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.job.errors import JobCancelled, JobError
from pipeline.preflight import check_spec, checked, load_checked
from pipeline.spec import JobSpec

#: what :func:`run` accepts as a spec: a YAML or JSON file, its data, or a parsed spec
SpecLike = str | os.PathLike[str] | Mapping[str, Any] | JobSpec


@dataclass(frozen=True)
class RunResult:
    """A finished job: where its output is, and what ``stats.json`` and ``manifest.json`` say."""

    #: the output folder (a Path; the URI of an object-store output stays a string)
    output: Path | str
    #: ``stats.json`` as written: per stage docs in and out, drops by reason, counters, scores
    stats: dict[str, Any]
    #: ``manifest.json`` as written; None for a job without shards (documents only, or ``output.split_by``)
    manifest: dict[str, Any] | None = None
    #: the spec the job ran, checked
    spec: JobSpec | None = field(default=None, repr=False)


def load(spec: SpecLike) -> JobSpec:
    """``spec`` checked as ``tokenmill run`` checks it (schema, then the files it names): a path's relative paths
    resolve against its folder, a mapping's against the current one; :class:`SpecError` names every problem."""
    if isinstance(spec, JobSpec):
        return check_spec(spec)
    if isinstance(spec, Mapping):
        return checked(dict(spec))
    return load_checked(Path(spec))


def run(spec: SpecLike, *, overwrite: bool = False, on_event: Callable[[Any], None] | None = None) -> RunResult:
    """Run a job spec (a path, a dict or a :class:`~pipeline.spec.JobSpec`) to the end and return its result.

    No live view: ``on_event`` gets each of the job's events (:mod:`pipeline.job.events`) instead. ``overwrite``
    replaces an earlier run's output, as ``tokenmill run --overwrite`` does. Raises :class:`SpecError` for a spec
    that cannot run, :class:`JobError` (its ``category`` says whose fault) for a job that fails, and
    :class:`JobCancelled` (a JobError) for one cancelled."""
    from pipeline.job.engine import Job  # lazy: Ray is imported only when a job runs

    job_spec = load(spec)
    if overwrite and not job_spec.output.overwrite:
        job_spec = checked({**job_spec.model_dump(), "output": {**job_spec.output.model_dump(), "overwrite": True}})
    result = Job(job_spec, on_event=on_event).run()
    manifest = json.loads(result.manifest.to_json()) if result.manifest is not None else None
    output = result.output_dir if isinstance(result.output_dir, Path) else str(result.output_dir)
    return RunResult(output, dict(result.stats), manifest, job_spec)


__all__ = ["JobCancelled", "JobError", "RunResult", "load", "run"]
