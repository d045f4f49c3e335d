"""A job's stored summary: its events folded by :class:`pipeline.job.fold.JobSummary`, what ``GET /v1/jobs/{id}``
shows while it runs and after.

The store keeps events as dicts (``pipeline.job.events.to_dict`` dicts and the service's own ``state`` events,
:class:`pipeline.job.events.StateChanged`); here they are parsed back into typed events and folded into the
summary's JSON (:meth:`JobSummary.to_dict`). A record no event class reads (an unknown type, a missing field)
changes no figure. When a job succeeds the supervisor adds the output's ``stats.json`` (:func:`with_stats`),
which is the authority for the final per-stage counts, throughput and timings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.job import events as ev
from pipeline.job.fold import JobSummary


def fold_all(summary: Mapping[str, object], records: Iterable[Mapping[str, object]]) -> dict[str, object]:
    """``summary`` with every record folded in, in order (a new dict)."""
    try:
        figures = JobSummary.from_dict(summary)
    except ValueError:  # not a summary this code wrote: the figures start again from the next job_started
        figures = JobSummary()
    for rec in records:
        event = parse(rec)
        if event is not None:
            figures.apply(event)
    return figures.to_dict()


def fold(summary: Mapping[str, object], rec: Mapping[str, object]) -> dict[str, object]:
    """``summary`` updated with one record (a new dict)."""
    return fold_all(summary, [rec])


def parse(rec: Mapping[str, object]) -> ev.Event | None:
    """The typed event of a stored record; None for one no event class reads."""
    try:
        return ev.from_dict(rec)
    except (ValueError, TypeError):
        return None


def with_stats(summary: dict[str, Any], stats: dict[str, Any]) -> dict[str, Any]:
    """The summary of a finished job with its ``stats.json`` figures in place of the running estimates."""
    s = dict(summary)
    s["stages"] = {st["stage"]: {k: v for k, v in st.items() if k != "stage"} for st in stats.get("stages", [])}
    if "throughput" in stats:
        s["throughput"] = dict(stats["throughput"])
    if "seconds" in stats:
        s["seconds"] = dict(stats["seconds"])
    out = stats.get("output") or {}
    if out:
        s["shards"] = {**(s.get("shards") or {}), "total": out.get("shards")}
        s.update(samples=out.get("samples"), tokens=out.get("tokens"))
    return s
