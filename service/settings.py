"""The service's settings: from ``tokenmill serve`` flags, else ``TOKENMILL_*`` environment variables, else defaults.

========================  =============================  ====================================================
setting                   environment variable           default
========================  =============================  ====================================================
state_dir                 TOKENMILL_STATE_DIR            ``./tokenmill-service`` (SQLite file, lock, jobs' folders)
database_url              TOKENMILL_DATABASE_URL         ``sqlite:///STATE_DIR/tokenmill.db``
database_schema           TOKENMILL_DATABASE_SCHEMA      none (PostgreSQL only: the tables' schema)
input_roots               TOKENMILL_INPUT_ROOTS          ``STATE_DIR/data`` (``:``-separated folders or URIs)
output_roots              TOKENMILL_OUTPUT_ROOTS         ``STATE_DIR/data``
(both)                    TOKENMILL_ROOTS                sets both lists at once; an entry ``TEAM=PATH`` is a
                                                         root of that team's only (``team_roots``)
max_running               TOKENMILL_MAX_RUNNING          1 (see ``service.runner.supervisor.RunnerConfig``)
ray_address               TOKENMILL_RAY_ADDRESS          none: each job starts a local Ray
ray_jobs_url              TOKENMILL_RAY_JOBS_URL         none: jobs run here (``http://head:8265``: Ray Jobs API)
ray_start_timeout_s       TOKENMILL_RAY_START_TIMEOUT_S  120 (seconds a job has to start or join Ray, else FAILED infra)
job_cpus                  TOKENMILL_JOB_CPUS             none: a local Ray takes every CPU
max_job_cpus              TOKENMILL_MAX_JOB_CPUS         local Ray: the CPUs here, or job_cpus if more; cluster: none
max_body_bytes            TOKENMILL_MAX_BODY_BYTES       1 MiB
auth_cache_s              TOKENMILL_AUTH_CACHE_S         10 (seconds a revoked key may still work; 0: no cache)
head_timeout_s            TOKENMILL_HEAD_TIMEOUT_S       10 (seconds for a request's line and headers)
body_timeout_s            TOKENMILL_BODY_TIMEOUT_S       10 (seconds for its body, after the headers)
keepalive_s               TOKENMILL_KEEPALIVE_S          5 (seconds an idle connection stays open)
max_connections           TOKENMILL_MAX_CONNECTIONS      1000 per process (beyond: 503)
lease_s                   TOKENMILL_LEASE_S              10 (PostgreSQL: seconds before another replica takes over
                                                         the jobs and schedules of one that died)
========================  =============================  ====================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.job.events import RAY_START_TIMEOUT_S
from pipeline.problems import Problem, validation_error
from service.confine import Roots
from service.roles import TEAM_RE, check_team

#: a request body larger than this gets 413. A job spec is a few kilobytes (the largest in tests/ is under
#: 2 KB); a megabyte leaves room for long stage lists while keeping a flood of bodies cheap to refuse
MAX_BODY_BYTES = 1 << 20
#: seconds an API key read from the database is trusted by service.api.keycache (the revocation delay across
#: processes): short next to how long it takes to notice a leaked key, long next to a poller's interval
AUTH_CACHE_S = 10.0
#: seconds for a request's head, then for its body: a client on a slow link sends a spec's few kilobytes in well
#: under a second, and a stranger who stalls holds a connection (and the memory of what it sent) this long at most
HEAD_TIMEOUT_S = BODY_TIMEOUT_S = 10.0

#: seconds a replica's lease on the supervisor and the scheduler outlasts its last renewal (PostgreSQL:
#: :mod:`service.runner.lease`). 10 s keeps a takeover (the lease, then the next poll) within 15 s; renewals come
#: every poll, so a leader loses its lease only when its database is out of reach for that long
LEASE_S = 10.0


def team_root(entry: str) -> tuple[str, str] | None:
    """``(team, path)`` of a root entry ``TEAM=PATH`` (a team's own root), else None (a root of every team)."""
    team, sep, path = entry.partition("=")
    return (team, path) if sep and TEAM_RE.fullmatch(team) and path else None


def team_roots(entries: list[str]) -> dict[str, tuple[str, ...]]:
    """``{team: paths}`` of the ``TEAM=PATH`` entries among ``entries``."""
    found: dict[str, tuple[str, ...]] = {}
    for entry in entries:
        parsed = team_root(entry)
        if parsed is not None:
            found[parsed[0]] = (*found.get(parsed[0], ()), parsed[1])
    return found


def machine_cpus(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """CPUs this process may use: its affinity mask, or its cgroup v2 quota if fewer (a container's
    ``--cpus``, a pod's CPU limit; rounded up), so a default cap in a container is the container's size."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):  # no cgroup v2 file (not Linux, cgroup v1): the mask alone
        pass
    return cpus


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: Path = Path("tokenmill-service")
    database_url: str | None = None
    database_schema: str | None = None
    #: folders, or object-store URIs (``s3://bucket/prefix``, kept as strings: a Path would fold the ``//``)
    input_roots: tuple[str, ...] = ()
    output_roots: tuple[str, ...] = ()
    #: ``{team: folders or URIs}`` its jobs may read and write instead of the roots above (``--root TEAM=PATH``,
    #: ``TOKENMILL_ROOTS=TEAM=PATH:...``); a team without any uses the roots above
    team_roots: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    max_running: int = Field(1, ge=1)
    ray_address: str | None = None
    #: submit each job to this Ray Jobs API (the head's dashboard, ``http://head:8265``) instead of running it
    #: here: see service.runner.ray_jobs (the state folder must be shared with the head)
    ray_jobs_url: str | None = None
    #: seconds each job has to start or join Ray, else it ends FAILED ``infra`` (see pipeline.job.tasks.start_ray)
    ray_start_timeout_s: float = Field(RAY_START_TIMEOUT_S, gt=0)
    #: CPUs of each job's local Ray when its spec leaves ``execution.num_cpus`` out: a default, not a limit
    job_cpus: int | None = Field(None, ge=1)
    #: the most CPUs a spec may ask (``execution.num_cpus``, ``execution.parallelism``; more gets 422, see
    #: service.admission); None: :attr:`job_cpu_cap`'s default
    max_job_cpus: int | None = Field(None, ge=1)
    max_body_bytes: int = Field(MAX_BODY_BYTES, ge=1024)
    #: run the supervisor in this process (off: an API-only process, as in tests of the API alone)
    run_supervisor: bool = True
    #: serve /docs, /redoc and /openapi.json without a key (off: only /openapi.json, with a key)
    public_docs: bool = False
    #: see :class:`service.runner.supervisor.RunnerConfig`
    max_lost: int = Field(3, ge=1)
    cancel_grace_s: float = Field(60.0, gt=0)
    poll_s: float = Field(0.5, gt=0)
    #: seconds a replica's lease on the supervisor and the scheduler outlasts its last renewal on PostgreSQL
    #: (:mod:`service.runner.lease`): how long the others wait to take over from one that died
    lease_s: float = Field(LEASE_S, gt=0)
    #: seconds an API key read from the database is trusted (service.api.keycache): a key revoked by another
    #: process stops working here within this long; 0 reads the key on every request
    auth_cache_s: float = Field(AUTH_CACHE_S, ge=0)
    #: the HTTP edge (service.api.edge, service.api.server): seconds a connection has to send a request's line and
    #: headers (from its opening, or from its next byte after a response), then its body; an idle connection's
    #: seconds between requests; connections (and requests in flight) one process takes before answering 503
    head_timeout_s: float = Field(HEAD_TIMEOUT_S, gt=0)
    body_timeout_s: float = Field(BODY_TIMEOUT_S, gt=0)
    keepalive_s: int = Field(5, ge=1)
    max_connections: int = Field(1000, ge=1)
    #: seconds between two database reads of a server-sent event stream that has nothing new
    events_poll_s: float = Field(0.5, gt=0)
    #: once started, keep the objects alive then out of the garbage collector's full collections (see
    #: service.api.app.freeze_gc): ``tokenmill serve`` sets it; a process making many apps (tests) must not
    freeze_gc: bool = False

    @field_validator("input_roots", "output_roots", mode="before")
    @classmethod
    def _fspaths(cls, value: Any) -> Any:
        return tuple(os.fspath(v) for v in value) if isinstance(value, (list, tuple)) else value

    @field_validator("team_roots", mode="before")
    @classmethod
    def _team_paths(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            for team in value:
                check_team(team)
            return {team: tuple(os.fspath(v) for v in paths) for team, paths in value.items()}
        return value

    @field_validator("state_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        """Absolute, so the attempts' folders recorded in the database mean the same after a restart from
        another working directory."""
        return Path(os.path.abspath(value))

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.state_dir / 'tokenmill.db'}"

    @property
    def job_cpu_cap(self) -> int | None:
        """The most CPUs one job's spec may ask: ``max_job_cpus``; unset, with jobs on a local Ray, the CPUs
        this process may use (or ``job_cpus`` if more: the admin's own default is always allowed); unset, on
        a cluster (``ray_address``, ``ray_jobs_url``), none: the cluster's size and autoscaler bound a job."""
        if self.max_job_cpus is not None:
            return self.max_job_cpus
        if self.ray_address or self.ray_jobs_url:
            return None
        return max(machine_cpus(), self.job_cpus or 0)

    @model_validator(mode="after")
    def _default_within_cap(self) -> Settings:
        if self.job_cpus and self.max_job_cpus and self.job_cpus > self.max_job_cpus:
            raise validation_error("Settings", [Problem(("job_cpus",), (
                f"{self.job_cpus} is what a job gets by default: it may not exceed max_job_cpus "
                f"({self.max_job_cpus})"), "above_cap")])
        return self

    def roots(self, team: str | None = None) -> Roots:
        """The folders a job of ``team`` may read and write: its own roots when it has some, else the service's;
        None (an admin, or serving what any job wrote): all of them."""
        default = (self.state_dir / "data",)
        if team is not None and team in self.team_roots:
            return Roots.of(self.team_roots[team], self.team_roots[team])
        mine = Roots.of(self.input_roots or default, self.output_roots or default)
        if team is not None or not self.team_roots:
            return mine
        every = [p for paths in self.team_roots.values() for p in paths]
        return Roots.of([*(self.input_roots or default), *every], [*(self.output_roots or default), *every])

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``TOKENMILL_*`` variables; ``overrides`` (not None) win."""
        env = os.environ if environ is None else environ

        def entries(raw: str | None) -> list[str]:
            # ``:``-separated, except the ``:`` of a URI's ``scheme://`` (``/data:s3://bucket/in``)
            return [p for p in re.split(r":(?!//)", raw) if p] if raw else []

        def paths(name: str) -> tuple[str, ...] | None:
            found = tuple(p for p in entries(env.get(name) or env.get("TOKENMILL_ROOTS")) if not team_root(p))
            return found or None

        values: dict[str, Any] = {
            "state_dir": env.get("TOKENMILL_STATE_DIR"),
            "database_url": env.get("TOKENMILL_DATABASE_URL"),
            "database_schema": env.get("TOKENMILL_DATABASE_SCHEMA"),
            "input_roots": paths("TOKENMILL_INPUT_ROOTS"),
            "output_roots": paths("TOKENMILL_OUTPUT_ROOTS"),
            "team_roots": team_roots(entries(env.get("TOKENMILL_ROOTS"))) or None,
            "max_running": env.get("TOKENMILL_MAX_RUNNING"),
            "ray_address": env.get("TOKENMILL_RAY_ADDRESS"),
            "ray_jobs_url": env.get("TOKENMILL_RAY_JOBS_URL"),
            "ray_start_timeout_s": env.get("TOKENMILL_RAY_START_TIMEOUT_S"),
            "job_cpus": env.get("TOKENMILL_JOB_CPUS"),
            "max_job_cpus": env.get("TOKENMILL_MAX_JOB_CPUS"),
            "max_body_bytes": env.get("TOKENMILL_MAX_BODY_BYTES"),
            "auth_cache_s": env.get("TOKENMILL_AUTH_CACHE_S"),
            "head_timeout_s": env.get("TOKENMILL_HEAD_TIMEOUT_S"),
            "body_timeout_s": env.get("TOKENMILL_BODY_TIMEOUT_S"),
            "keepalive_s": env.get("TOKENMILL_KEEPALIVE_S"),
            "max_connections": env.get("TOKENMILL_MAX_CONNECTIONS"),
            "lease_s": env.get("TOKENMILL_LEASE_S"),
        }
        values.update(overrides)
        return cls(**{k: v for k, v in values.items() if v not in (None, "")})
