"""``/healthz`` (the process answers) and ``/readyz`` (it can do its work); neither needs a key.

Readiness checks:

- **database**: ``SELECT 1`` answers;
- **supervisor**: this process runs the supervisor thread (or the service was started without it);
  ``leading: false`` in its detail means another process holds the supervisor lock (SQLite) or lease
  (PostgreSQL) and runs the jobs;
- **ray**: with a cluster address, a TCP connection to it opens within a second (the job processes
  connect to it; nothing else is asked of the cluster); without one, that Ray is installed, since each
  job process starts its own local Ray node and there is nothing to reach beforehand.

``leader`` says whether this replica leads the supervisor and the scheduler (:mod:`service.runner.lease`);
readiness does not depend on it, since every replica serves the API.
"""

from __future__ import annotations

import importlib.util
import socket

from fastapi import APIRouter, Request, Response, status
from starlette.concurrency import run_in_threadpool

from pipeline.error_line import error_line
from service.api import schemas
from service.api.deps import DbDep, SettingsDep, SupervisorDep

router = APIRouter(tags=["health"])
#: seconds a readiness probe waits for the Ray cluster's port (a probe must answer well within its own timeout)
RAY_CONNECT_TIMEOUT_S = 1.0


@router.get("/healthz", response_model=schemas.Health)
async def healthz() -> schemas.Health:
    return schemas.Health(status="ok")  # async: nothing to wait for, so no trip to the thread pool


@router.get("/readyz", response_model=schemas.Readiness, responses={503: {"model": schemas.Readiness}})
async def readyz(request: Request, response: Response, db: DbDep, settings: SettingsDep,
                 supervisor: SupervisorDep) -> schemas.Readiness:
    checks = {
        "database": await run_in_threadpool(_check_database, db),
        "supervisor": _check_supervisor(supervisor, settings.run_supervisor),
        "ray": await run_in_threadpool(_check_ray, settings.ray_address),
    }
    ready = all(c.ok for c in checks.values())
    if not ready:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    scheduler = getattr(request.app.state, "scheduler", None)
    leader = schemas.Leader(supervisor=supervisor is not None and supervisor.leading,
                            scheduler=scheduler is not None and scheduler.leading)
    return schemas.Readiness(status="ready" if ready else "not_ready", checks=checks, leader=leader)


def _check_database(db: DbDep) -> schemas.Check:
    try:
        db.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means not ready, with its reason
        return schemas.Check(ok=False, detail=error_line(exc))
    return schemas.Check(ok=True, detail=db.url.render_as_string(hide_password=True))


def _check_supervisor(supervisor: SupervisorDep, wanted: bool) -> schemas.Check:
    if not wanted:
        return schemas.Check(ok=True, detail="not run in this process (API only)")
    if supervisor is None or not supervisor.running:
        return schemas.Check(ok=False, detail="the supervisor thread is not running")
    return schemas.Check(ok=True, detail=f"running; leading: {str(supervisor.leading).lower()}")


def _check_ray(address: str | None) -> schemas.Check:
    if not address:
        if importlib.util.find_spec("ray") is None:
            return schemas.Check(ok=False, detail="ray is not installed")
        return schemas.Check(ok=True, detail="local: each job starts its own Ray node")
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return schemas.Check(ok=True, detail=f"{address}: not a host:port, not probed")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return schemas.Check(ok=False, detail=f"{address}: {exc.strerror or exc}")
    return schemas.Check(ok=True, detail=f"{address}: reachable")
