"""``/metrics``: the service's figures for Prometheus: jobs by state, documents through each stage, phase and
stage durations, tokens and shards written, and the API's own request latency.

**Auth.** Like every route but the probes, ``/metrics`` needs a bearer key: its figures name stages and drop
reasons of the jobs, which are the users' business. Prometheus sends one with
``authorization: {type: Bearer, credentials_file: <file holding a key from tokenmill apikey create>}`` in the
scrape config.

**Where the figures come from.** The job figures are read from the store at scrape time (a custom collector),
not counted in this process, so every API process reports the same totals whichever one Prometheus scrapes and
nothing is lost on a restart. Totals are sums over the jobs' summaries (``service.runner.summary``): a job's
figures are those of its latest attempt, so a retry that restarts from zero lowers a total, which Prometheus
reads as a counter reset. Reading every summary at every scrape would grow with the job table, so each job's
contribution is cached under its ``updated_at`` (changed by every event the supervisor stores) and only jobs
updated since the last scrape are read again. The HTTP latency histogram and the ``process_*`` figures are this
process's own (one registry per app).
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from sqlalchemy import func, select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.deps import KeyDep
from service.store.db import Database
from service.store.models import Job, JobState

router = APIRouter(tags=["metrics"])

#: HTTP latency buckets, seconds: prometheus_client's default buckets (5 ms to 10 s) with 1 ms and 2.5 ms added
#: below them, since a status poll takes a few milliseconds and the API's goal is p99 < 50 ms (bench/api_load.py)
HTTP_BUCKETS = (0.001, 0.0025, *Histogram.DEFAULT_BUCKETS)
#: phase duration buckets, seconds: from a second (a tiny test job) to 12 hours; a phase's time grows with its
#: input, bench/e2e.py's few hundred MB already spend minutes in each phase on 2 cores, a TB-scale corpus hours
PHASE_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 3 * 3600.0, 6 * 3600.0, 12 * 3600.0)
#: jobs whose summary is read per query while catching up (bounded so one scrape never holds a huge result)
FETCH_CHUNK = 500
_ORDER = re.compile(r"^\d+-")  # "02-exact_dedup" -> "exact_dedup": a bounded label set, whatever the job


def install(app: FastAPI) -> None:
    """Give ``app`` its registry (HTTP latency + the store's figures), the timing middleware and ``/metrics``."""
    registry = CollectorRegistry(auto_describe=True)
    latency = Histogram("tokenmill_http_request_duration_seconds",
                        "Time from a request's arrival to its response's start, by route template and status",
                        ["method", "route", "status"], buckets=HTTP_BUCKETS, registry=registry)
    registry.register(StoreCollector(lambda: getattr(app.state, "db", None)))
    ProcessCollector(registry=registry)  # this process's CPU seconds, memory and open files
    app.state.metrics_registry = registry
    app.add_middleware(HttpLatency, histogram=latency)
    app.include_router(router)


@router.get("/metrics", response_class=Response, responses={
    200: {"content": {"text/plain": {"schema": {"type": "string"}},
                      "application/openmetrics-text": {"schema": {"type": "string"}}},
          "description": "Prometheus text exposition format (OpenMetrics when Accept asks for it)"}})
def metrics(request: Request, key: KeyDep) -> Response:
    """The service's figures in Prometheus' text format (OpenMetrics when the scraper asks for it)."""
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encoder(request.app.state.metrics_registry), media_type=content_type)


# ---- HTTP latency -------------------------------------------------------------------------------------------


class HttpLatency:
    """Pure ASGI middleware (no buffering, so server-sent event streams pass through untouched).

    It times until the response starts: for a plain response that is the handler's whole work, for an event
    stream the time to its first byte, which is what a client waits for. Requests are labelled with the route
    *template* (``/v1/jobs/{job_id}``), never the raw path, so the label set stays bounded; a path no route
    matches is ``unmatched``. An exception that escapes the app is counted as a 500, as the server answers it.
    """

    def __init__(self, app: ASGIApp, histogram: Histogram):
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        observed = False

        def observe(status: int) -> None:
            nonlocal observed
            observed = True
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.histogram.labels(scope["method"], route, str(status)).observe(time.perf_counter() - start)

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not observed:
                observe(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        except BaseException:
            if not observed:
                observe(500)
            raise


# ---- the store's figures --------------------------------------------------------------------------------------


@dataclass
class JobFigures:
    """One job's contribution to the totals, from its summary."""

    docs_in: Counter[str] = field(default_factory=Counter)
    docs_out: Counter[str] = field(default_factory=Counter)
    dropped: Counter[tuple[str, str]] = field(default_factory=Counter)
    stage_seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    #: (phase, seconds) of each finished phase
    phases: list[tuple[str, float]] = field(default_factory=list)
    tokens: int = 0
    shards_written: int = 0
    shards_reused: int = 0

    @classmethod
    def of(cls, summary: dict[str, Any] | None) -> JobFigures:
        s = summary if isinstance(summary, dict) else {}
        out = cls()
        stages = s.get("stages")
        for key, st in (stages.items() if isinstance(stages, dict) else ()):
            if not isinstance(st, dict):
                continue
            name = _ORDER.sub("", str(key))
            out.docs_in[name] += _count(st.get("docs_in"))
            out.docs_out[name] += _count(st.get("docs_out"))
            out.stage_seconds[name] += _num(st.get("seconds"))
            dropped = st.get("dropped")
            for reason, n in (dropped.items() if isinstance(dropped, dict) else ()):
                out.dropped[(name, str(reason))] += _count(n)
        phases = s.get("phases")
        for phase, info in (phases.items() if isinstance(phases, dict) else ()):
            if isinstance(info, dict) and info.get("state") == "finished":
                out.phases.append((str(phase), _num(info.get("seconds"))))
        raw_shards = s.get("shards")
        shards: dict[str, Any] = raw_shards if isinstance(raw_shards, dict) else {}
        out.tokens = _count(s.get("tokens"))
        out.shards_written, out.shards_reused = _count(shards.get("written")), _count(shards.get("reused"))
        return out


def _num(value: Any) -> float:
    """A figure from a stored summary: a number, 0 for anything else (bool included)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _count(value: Any) -> int:
    """A counter from a stored summary: a whole number, 0 for anything else."""
    return int(_num(value))


class StoreCollector(Collector):
    """Collects the job figures from the database at scrape time; see the module docstring for the cache."""

    def __init__(self, get_db: Callable[[], Database | None]):
        self.get_db = get_db
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[datetime, JobFigures]] = {}

    def collect(self) -> Iterator[Metric]:
        db = self.get_db()
        if db is None:  # before startup: no store yet
            return
        with self._lock:
            states, figures = self._read(db)
        jobs = GaugeMetricFamily("tokenmill_jobs", "Jobs in each state", labels=["state"])
        for state in JobState:
            jobs.add_metric([state.value], states.get(state.value, 0))
        yield jobs
        yield from _families(figures)

    def _read(self, db: Database) -> tuple[dict[str, int], list[JobFigures]]:
        with db.read() as s:
            states = {str(k): int(v) for k, v in s.execute(select(Job.state, func.count()).group_by(Job.state))}
            stamps = {job_id: at for job_id, at in s.execute(select(Job.id, Job.updated_at))}
            stale = [job_id for job_id, at in stamps.items() if self._cache.get(job_id, (None,))[0] != at]
            for i in range(0, len(stale), FETCH_CHUNK):
                chunk = stale[i:i + FETCH_CHUNK]
                rows = s.execute(select(Job.id, Job.updated_at, Job.summary).where(Job.id.in_(chunk)))
                for job_id, at, summary in rows:
                    self._cache[job_id] = (at, JobFigures.of(summary))
        for gone in self._cache.keys() - stamps.keys():
            del self._cache[gone]
        return states, [f for _, f in self._cache.values()]


def _families(figures: list[JobFigures]) -> Iterator[Metric]:
    def counter(name: str, doc: str, labels: list[str], values: Mapping[Any, float]) -> CounterMetricFamily:
        fam = CounterMetricFamily(name, doc, labels=labels)
        for key, value in sorted(values.items()):
            fam.add_metric(list(key) if isinstance(key, tuple) else [key], value)
        return fam

    totals: dict[str, Counter[Any]] = {k: Counter() for k in ("in", "out", "dropped")}
    stage_seconds: defaultdict[str, float] = defaultdict(float)
    phases: dict[str, list[float]] = {}
    tokens = written = reused = 0
    for f in figures:
        totals["in"].update(f.docs_in)
        totals["out"].update(f.docs_out)
        totals["dropped"].update(f.dropped)
        for stage, seconds in f.stage_seconds.items():
            stage_seconds[stage] += seconds
        for phase, seconds in f.phases:
            phases.setdefault(phase, []).append(seconds)
        tokens, written, reused = tokens + f.tokens, written + f.shards_written, reused + f.shards_reused
    yield counter("tokenmill_stage_documents_in", "Documents that entered each stage (read: records read)",
                  ["stage"], totals["in"])
    yield counter("tokenmill_stage_documents_out", "Documents each stage kept", ["stage"], totals["out"])
    yield counter("tokenmill_stage_documents_dropped", "Documents each stage set aside, per reason",
                  ["stage", "reason"], totals["dropped"])
    yield counter("tokenmill_stage_seconds", "Seconds spent in each stage, summed over its workers",
                  ["stage"], stage_seconds)
    hist = HistogramMetricFamily("tokenmill_phase_duration_seconds", "Duration of each finished job phase",
                                 labels=["phase"])
    for phase, values in sorted(phases.items()):
        buckets = [(floatToGoString(b), float(sum(v <= b for v in values))) for b in PHASE_BUCKETS]
        hist.add_metric([phase], [*buckets, ("+Inf", float(len(values)))], sum_value=sum(values))
    yield hist
    yield CounterMetricFamily("tokenmill_tokens_written", "Tokens in the shards of the jobs' latest attempts",
                              value=tokens)
    shards = CounterMetricFamily("tokenmill_shards", "Shards the jobs' latest attempts wrote or kept",
                                 labels=["how"])
    shards.add_metric(["written"], written)
    shards.add_metric(["reused"], reused)
    yield shards
