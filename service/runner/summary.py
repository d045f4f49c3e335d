"""A job's figures, folded from its events: what ``GET /v1/jobs/{id}`` shows while it runs and after.

Pure functions of the event records (``pipeline.job.events.to_dict`` dicts and the service's ``state``
events), so every rate comes from event timestamps and the fold can be tested without a job. Each
``job_started`` begins a new attempt's figures (a resumed attempt re-reports the shards it keeps, with
``reused: true``). When a job succeeds the supervisor adds the output's ``stats.json`` (:func:`with_stats`),
which is the authority for the final per-stage counts, throughput and timings.
"""

from __future__ import annotations

from typing import Any


def fold(summary: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
    """``summary`` updated with one event (a new dict; unknown event types leave it as it was)."""
    s = dict(summary)
    kind, ts = rec.get("type"), float(rec.get("ts") or 0.0)
    if kind == "job_started":
        s = {"attempt": s.get("attempt"), "started_ts": ts, "phase": None, "phases": {}, "progress": {},
             "stages": {}, "shards": {"written": 0, "reused": 0, "total": None}, "samples": 0, "tokens": 0,
             "documents": None, "throughput": {"docs_per_s": None, "tokens_per_s": None},
             "seconds": {}, "resumed_phases": list(rec.get("resumed_phases") or []),
             "parallelism": rec.get("parallelism")}
    elif kind == "state":
        s["attempt"] = rec.get("attempt")
    elif kind == "phase":
        phases = dict(s.get("phases") or {})
        entry = {"state": rec.get("state"), "seconds": rec.get("seconds", 0.0)}
        if rec.get("state") == "started":
            entry["started_ts"] = ts
            s["phase"] = rec.get("phase")
        phases[rec.get("phase")] = {**phases.get(rec.get("phase"), {}), **entry}
        s["phases"] = phases
        if rec.get("state") in ("finished", "skipped"):
            s["seconds"] = {**s.get("seconds", {}), rec["phase"]: rec.get("seconds", 0.0)}
    elif kind == "progress":
        phase = rec.get("phase")
        started = (s.get("phases") or {}).get(phase, {}).get("started_ts")
        per_s = round(rec["done"] / (ts - started), 1) if started is not None and ts > started else None
        s["progress"] = {**(s.get("progress") or {}),
                         phase: {"done": rec.get("done"), "total": rec.get("total"), "unit": rec.get("unit"),
                                 "per_s": per_s}}
        if phase == "curate":
            s["throughput"] = {**_throughput(s), "docs_per_s": per_s}
    elif kind == "stage_counters":
        s["stages"] = rec.get("stages") or {}
    elif kind == "shard_written":
        shards = dict(s.get("shards") or {"written": 0, "reused": 0, "total": None})
        shards["reused" if rec.get("reused") else "written"] += 1
        s["shards"] = shards
        s["samples"] = int(s.get("samples") or 0) + int(rec.get("samples") or 0)
        s["tokens"] = int(s.get("tokens") or 0) + int(rec.get("tokens") or 0)
        if not rec.get("reused"):
            s["new_tokens"] = int(s.get("new_tokens") or 0) + int(rec.get("tokens") or 0)
            started = (s.get("phases") or {}).get("write", {}).get("started_ts")
            if started is not None and ts > started:
                s["throughput"] = {**_throughput(s), "tokens_per_s": round(s["new_tokens"] / (ts - started), 1)}
    elif kind == "job_finished":
        s["phase"] = None
        s["shards"] = {**(s.get("shards") or {}), "total": rec.get("shards")}
        s.update(samples=rec.get("samples"), tokens=rec.get("tokens"), documents=rec.get("documents"))
        s["seconds"] = {**s.get("seconds", {}), "total": rec.get("seconds")}
    elif kind == "job_failed":
        s["error"] = {"category": rec.get("category"), "message": rec.get("message"), "phase": rec.get("phase")}
    return s


def _throughput(s: dict[str, Any]) -> dict[str, Any]:
    return dict(s.get("throughput") or {"docs_per_s": None, "tokens_per_s": None})


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
