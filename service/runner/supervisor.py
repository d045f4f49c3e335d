"""The supervisor: starts queued jobs within a concurrency limit and reconciles running ones with reality.

One thread per service, and one leading service at a time (:mod:`service.runner.lease`: an ``flock`` on
``STATE/supervisor.lock`` with SQLite, the ``supervisor`` lease row with PostgreSQL: extra API workers, or
other replicas, serve requests but leave the jobs to the holder; if it dies, another takes over). Every write
that acts on a job (launching an attempt, finishing, failing or requeueing it, delivering a cancel, answering a
publish request) checks the lease in its transaction (:meth:`LeaderLoop.fence`). Every ``poll_s`` (or at once
when the API wakes it) a tick does:

1. **reconcile** each RUNNING / CANCELLING job: find its process (pid + start time + command line; see
   :mod:`service.runner.process`; or its Ray Jobs submission), store the events it reported
   (:mod:`service.runner.report`) as job events and fold them into the job's summary, deliver a cancel (SIGTERM once,
   SIGKILL to its session after ``cancel_grace_s``), and when the process is gone kill what is left of its session
   (its local Ray node: :func:`process.kill_session`) and decide the outcome from its terminal event:
   ``job_finished`` -> SUCCEEDED, ``job_failed`` -> FAILED(category) or CANCELLED; and answer a job process that asks
   to publish its output, under the job's row lock and in one transaction: refused once a cancel was accepted, else
   granted, after which a cancel is a 409 (:mod:`service.runner.publish`, the contract). A process that died without
   one (SIGKILL, a crash, the machine) is *lost*: the job goes back to the front of the queue and its next attempt
   resumes the output's work (finished phases and shards kept), up to ``max_lost`` times in a row; a job being
   cancelled becomes CANCELLED.
2. **schedule**: start the oldest QUEUED jobs while fewer than ``max_running`` run, skipping (for now)
   a job whose output folder a running job holds.

Nothing here keeps state that a restart would lose: a job that was running when the service died is
found again by the next service's first tick (re-attached if its process is alive, resumed if not), and
the engine's lock on the output folder is the last guard against two processes of one job.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from pipeline.job.events import RAY_START_TIMEOUT_S
from service.confine import Roots
from service.runner import process, publish, report
from service.runner.leader import LeaderLoop
from service.runner.lease import LEASE_S, Leadership, leadership_for
from service.runner.ray_jobs import RayJobs
from service.runner.summary import fold_all, with_stats
from service.store import repo
from service.store.db import Database
from service.store.models import ABLATION, ACTIVE, PIPELINE, Attempt, AttemptEvent, Job, JobState, utcnow

log = logging.getLogger("tokenmill.supervisor")

#: reported events stored per transaction (a tick catches up over several)
INGEST_CHUNK = 2000


@dataclass
class RunnerConfig:
    """What the supervisor needs from the service's settings."""

    state_dir: Path
    #: jobs running at once. 1 by default: a local job starts a Ray node sized to every CPU of the machine
    #: (``ray.init`` without ``num_cpus``), so two at once would only compete; raise it with a cluster or ``job_cpus``
    max_running: int = 1
    #: Ray address every job runs on (None: each job process starts its own local Ray)
    ray_address: str | None = None
    #: the Ray Jobs API (``http://head:8265``): each attempt is submitted there, its driver runs on the cluster
    #: (:mod:`service.runner.ray_jobs`); None: each attempt is a local process (:class:`process.LocalProcesses`)
    ray_jobs_url: str | None = None
    #: seconds each job process has to start or join Ray (``run.json``'s ``ray_start_timeout_s``)
    ray_start_timeout_s: float = RAY_START_TIMEOUT_S
    #: CPUs of each job's local Ray node when its spec leaves ``execution.num_cpus`` out
    job_cpus: int | None = None
    roots: Roots | None = None
    job_command: tuple[str, ...] = (sys.executable, "-m", "service.runner.job_process")
    env: Mapping[str, str] = field(default_factory=dict)
    #: attempts in a row that may die without a result before the job is FAILED(infra) instead of resumed
    max_lost: int = 3
    #: seconds between the cancel's SIGTERM and a SIGKILL to the job's session. The engine stops within
    #: seconds of SIGTERM (docs/jobs.md, "Cancel"); a minute leaves room for a slow Ray shutdown
    cancel_grace_s: float = 60.0
    poll_s: float = 0.5
    #: seconds the supervisor's lease lasts past its last renewal (PostgreSQL; :mod:`service.runner.lease`)
    lease_s: float = LEASE_S

    def jobs_dir(self) -> Path:
        return self.state_dir / "jobs"

    def run_dir(self, job_id: str, attempt: int) -> str:
        """The attempt's own folder where its process runs (its logs, shipped to the database): in the state
        folder here, in the temporary folder of the Ray head through the Jobs API (nothing is shared)."""
        base = Path(tempfile.gettempdir()) / "tokenmill-jobs" if self.ray_jobs_url else self.jobs_dir()
        return str(base / job_id / f"attempt-{attempt}")

    def executor(self, db: Database) -> process.Executor:
        """Where attempts run, told which database to report to (:func:`report.database_env`)."""
        url = db.url.render_as_string(hide_password=False)
        if self.ray_jobs_url:
            env = {**self.env, **report.database_env(url, db.schema, keep_password=False)}
            return RayJobs(self.ray_jobs_url, env=env, stop_wait_s=self.cancel_grace_s)
        env = {**self.env, **report.database_env(url, db.schema, keep_password=True)}
        return process.LocalProcesses(self.job_command, env, report.LOG_FILE)


class Supervisor(LeaderLoop):
    name = "supervisor"

    def __init__(self, db: Database, config: RunnerConfig, leadership: Leadership | None = None):
        super().__init__(leadership or leadership_for(db, self.name, config.state_dir / "supervisor.lock",
                                                      config.lease_s), config.poll_s)
        self.db = db
        self.config = config
        self.executor = config.executor(db)
        self._known: set[tuple[str, int]] = set()  # attempts this supervisor has seen (to note a re-attach once)
        self.host = socket.gethostname()

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self.config.jobs_dir().mkdir(parents=True, exist_ok=True)
        super().start()

    def tick(self) -> None:
        self.reconcile()
        self.schedule()

    # ---- reconcile ---------------------------------------------------------------------------------------

    def reconcile(self) -> None:
        with self.db.session() as s:
            ids = [j.id for j in repo.active_jobs(s)]
        for job_id in ids:
            while self._reconcile_job(job_id):
                pass

    def _reconcile_job(self, job_id: str) -> bool:
        """One step for one active job; True when there is more to do at once (a long events file)."""
        with self.db.session() as s:
            self.fence(s)
            job = repo.lock_job(s, job_id)
            if job.state not in ACTIVE:
                return False
            att = repo.current_attempt(s, job)
            if att is None:
                repo.transition(s, job, JobState.FAILED, category="app", message="no attempt record for a running job")
                return False
            alive = self.executor.alive(att)
            self._note_reattach(s, job, att, alive)
            more = self._ingest(s, job, att)
            if alive:
                if job.state == JobState.CANCELLING:
                    self._deliver_cancel(att)
                publish.decide(s, job, att)  # cancel or publish: decided here, under the row lock
                return more
            if more:
                return True  # every reported event first: the outcome is the last one
            self._finish(s, job, att, self.executor.ended(att))
            return False

    def _note_reattach(self, s: Session, job: Job, att: Attempt, alive: bool) -> None:
        key = (job.id, att.number)
        if key in self._known:
            return
        self._known.add(key)
        if alive and not self.executor.started_here(att):
            self._log_event(s, job, f"re-attached to {self.executor.name(att)} of attempt {att.number}")

    def _deliver_cancel(self, att: Attempt) -> None:
        now = utcnow()
        if att.cancel_sent_at is None:
            self.executor.cancel(att, force=False)
            att.cancel_sent_at = now
        elif now - att.cancel_sent_at > timedelta(seconds=self.config.cancel_grace_s):
            self.executor.cancel(att, force=True)

    def _ingest(self, s: Session, job: Job, att: Attempt) -> bool:
        """Store the events the attempt reported since the last look, in their order; True when more remain."""
        rows = s.scalars(select(AttemptEvent).where(AttemptEvent.job_id == job.id, AttemptEvent.attempt == att.number,
                                                    AttemptEvent.seq > att.events_offset)
                         .order_by(AttemptEvent.seq).limit(INGEST_CHUNK)).all()
        if not rows:
            return False
        records = [dict(r.data) for r in rows]
        repo.append_events(s, job, att.number, records)
        job.summary = fold_all(job.summary or {}, records)
        job.updated_at = utcnow()
        att.events_offset = rows[-1].seq
        s.execute(delete(AttemptEvent).where(AttemptEvent.job_id == job.id, AttemptEvent.attempt == att.number,
                                             AttemptEvent.seq <= att.events_offset))
        return len(rows) == INGEST_CHUNK

    def _finish(self, s: Session, job: Job, att: Attempt, ended: process.Ended) -> None:
        att.ended_at = utcnow()
        att.exit_code = ended.exit_code
        folder = self.executor.folder_here(att)
        if folder is not None:  # what the process could not ship itself (it was killed, it crashed)
            report.ship_rest(s, job.id, att.number, folder)
        final = repo.last_event(s, job.id, att.number, ("job_finished", "job_failed"))
        if final is not None and final.type == "job_finished":
            att.outcome = "succeeded"
            job.summary = with_stats(job.summary or {}, _read_stats(job.output_path))
            repo.transition(s, job, JobState.SUCCEEDED)
        elif final is not None:
            category, message = final.data.get("category") or "app", final.data.get("message")
            if category == "cancelled":
                att.outcome = "cancelled"
                repo.transition(s, job, JobState.CANCELLED, message=message)
            else:
                att.outcome = "failed"
                repo.transition(s, job, JobState.FAILED, category=category, message=message)
        else:
            att.outcome = "lost"
            how = ended.how
            lost = _trailing_lost(repo.attempts_of(s, job.id))
            if job.cancel_requested or ended.stopped:
                att.outcome = "cancelled" if ended.stopped else "lost"
                repo.transition(s, job, JobState.CANCELLED,
                                message=f"the job process ended before it reported its cancel ({how})")
            elif lost < self.config.max_lost:
                repo.transition(s, job, JobState.QUEUED,
                                message=f"attempt {att.number} ended without a result ({how}); resuming")
            else:
                repo.transition(s, job, JobState.FAILED, category="infra",
                                message=f"the job process ended without a result {lost} times in a row ({how}); "
                                        f"see GET /v1/jobs/{job.id}/logs")
        self.wake()  # a slot is free

    def _log_event(self, s: Session, job: Job, message: str) -> None:
        repo.append_events(s, job, job.attempt,
                           [{"type": "log", "ts": time.time(), "level": "info", "message": message,
                             "source": "service"}])

    # ---- schedule ----------------------------------------------------------------------------------------

    def schedule(self) -> None:
        with self.db.session() as s:
            active = repo.active_jobs(s)
            free = self.config.max_running - len(active)
            if free <= 0:
                return
            busy = {os.path.realpath(j.output_path) for j in active}
            chosen = []
            for job in repo.queued_jobs(s):
                out = os.path.realpath(job.output_path)
                if out in busy:
                    continue
                busy.add(out)
                chosen.append(job.id)
                if len(chosen) == free:
                    break
        for job_id in chosen:
            self._launch(job_id)

    def _launch(self, job_id: str) -> None:
        with self.db.session() as s:
            self.fence(s)
            try:
                job, att = repo.start_attempt(s, job_id, run_dir=self.config.run_dir, host=self.host)
            except repo.Conflict:  # cancelled in the meantime
                return
            # what the job process reads (service.runner.report): the database already holds the spec's secrets
            att.run = {"job_id": job.id, "attempt": att.number, "team": job.team, "kind": job.kind,
                       "spec": self._spec_for_run(job.spec, job.kind),
                       "roots": self.config.roots.to_json() if self.config.roots else None,
                       "ray_start_timeout_s": self.config.ray_start_timeout_s}
            run_dir, number = Path(att.run_dir), att.number
        self.check_leading()  # the lease ran out since: the next leader finds the attempt lost and resumes it
        try:
            ref = self.executor.launch(job_id, number, run_dir)
        except OSError as exc:
            with self.db.session() as s:
                self.fence(s)
                job = repo.lock_job(s, job_id)
                repo.get_attempt(s, job_id, number).outcome = "failed"
                repo.transition(s, job, JobState.FAILED, category="infra",
                                message=f"cannot start the job process: {exc}")
            return
        self._known.add((job_id, number))
        if ref is not None:
            with self.db.session() as s:
                self.fence(s)
                att = repo.get_attempt(s, job_id, number)
                att.pid, att.proc_started = ref.pid, ref.started
        log.info("job %s attempt %d: %s", job_id, number, f"pid {ref.pid}" if ref else "submitted")

    def _spec_for_run(self, spec: dict[str, Any], kind: str = PIPELINE) -> dict[str, Any]:
        """The stored spec with the service's execution settings: its Ray address, its default CPUs (an
        ablation's: in its ``base``, which every variant's job spec starts from)."""
        spec = json.loads(json.dumps(spec))
        ex = (spec.setdefault("base", {}) if kind == ABLATION else spec).setdefault("execution", {})
        # through the Jobs API the driver runs on the cluster: no address (Ray's RAY_ADDRESS), no local node
        ex["address"] = None if self.config.ray_jobs_url else self.config.ray_address
        if self.config.job_cpus and not ex.get("num_cpus") and not self.config.ray_address \
                and not self.config.ray_jobs_url:
            ex["num_cpus"] = self.config.job_cpus
        return spec


def _trailing_lost(attempts: Any) -> int:
    n = 0
    for att in reversed(list(attempts)):
        if att.outcome != "lost":
            break
        n += 1
    return n


def _read_stats(output_path: str) -> dict[str, Any]:
    try:
        data = json.loads((Path(output_path) / "stats.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
