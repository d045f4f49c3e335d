"""The FastAPI application: ``create_app(settings)`` wires the store, the supervisor and the routers.

At startup (the lifespan) the database is migrated to the latest revision and, unless the settings say
otherwise, the supervisor thread starts; at shutdown it stops, and the job processes keep running for
the next start to re-attach to. Add a feature as a router in ``service/api/routers/`` and include it here.

API docs: ``/openapi.json`` needs a key; ``/docs`` and ``/redoc`` (FastAPI's pages, whose Swagger UI and ReDoc
come from a CDN) are served, with the schema keyless, only with ``--public-docs``: a browser opening a page sends
no bearer key. Without it they answer a JSON 404 saying how to get them (:data:`DOCS_OFF`).

Errors are 4xx with a JSON ``detail`` (never a 500 for a bad request): 401 without a valid key (before the body
is read: :mod:`service.api.edge`), 403 a path outside the roots, 404 an unknown job, 408 a body that did not
arrive within ``body_timeout_s``, 409 a request the job's state does not allow, 413 a body over
``max_body_bytes``, 422 an invalid spec or parameter (``detail`` is a list of ``{loc, msg, type}``, ``loc``
the field path; a body that is not JSON or YAML, or nests deeper than :data:`pipeline.nesting.MAX_DEPTH`, is one
problem at ``["body"]``), 503 when the database does not answer.
"""

from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import metadata
from typing import Any

from fastapi import Depends, FastAPI, Request, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DataError, DBAPIError, OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from pipeline.problems import NO_MATCH, from_pydantic
from service.admission import Refused, beside_schema
from service.api.audit import Audit, mark_hidden
from service.api.deps import require_key
from service.api.edge import Edge
from service.api.keycache import KeyCache
from service.api.openapi import install as install_openapi
from service.api.routers import ablations, artifacts, audit, dashboard, health, jobs, metrics, mixtures, schedules
from service.runner.supervisor import RunnerConfig, Supervisor
from service.schedules.scheduler import Scheduler
from service.settings import Settings
from service.store import repo
from service.store.db import Database

#: what ``/docs`` and ``/redoc`` answer without ``--public-docs``
DOCS_OFF = ("the API docs pages are off: GET /openapi.json with the API key (Authorization: Bearer ...) for the "
            "schema, or start tokenmill serve with --public-docs to serve /docs, /redoc and /openapi.json without "
            "a key (the pages load Swagger UI and ReDoc from cdn.jsdelivr.net: the browser needs to reach it)")
#: the settings (JSON) that ``tokenmill serve --workers N`` hands its worker processes
SETTINGS_ENV = "TOKENMILL_SERVE_SETTINGS"


def app_from_env() -> FastAPI:
    """The app of one of ``tokenmill serve --workers N``'s processes (uvicorn's factory)."""
    return create_app(Settings.model_validate_json(os.environ[SETTINGS_ENV]))


def freeze_gc() -> None:
    """Move every object alive now (modules, classes, the app: hundreds of thousands) out of the collector's
    reach, so that its full collections scan only what requests create. A full collection of a started server
    walks all of them while every request waits; after this, none showed up under bench/api_load.py's load.
    Done at startup when ``Settings.freeze_gc`` says so (``tokenmill serve`` does): a frozen object is never
    freed, so not in tests, which make many apps in one process."""
    gc.collect()
    gc.freeze()


def runner_config(settings: Settings) -> RunnerConfig:
    return RunnerConfig(state_dir=settings.state_dir, max_running=settings.max_running,
                        ray_address=settings.ray_address, ray_jobs_url=settings.ray_jobs_url,
                        ray_start_timeout_s=settings.ray_start_timeout_s, job_cpus=settings.job_cpus,
                        roots=settings.roots(),
                        max_lost=settings.max_lost, cancel_grace_s=settings.cancel_grace_s, poll_s=settings.poll_s,
                        lease_s=settings.lease_s)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    public = settings.public_docs
    app = FastAPI(
        title="tokenmill",
        version=_version(),
        summary="Submit, follow, cancel and resume tokenmill jobs.",
        lifespan=_lifespan(settings),
        openapi_url="/openapi.json" if public else None,
        docs_url="/docs" if public else None,
        redoc_url="/redoc" if public else None,
    )
    app.state.settings = settings
    app.state.db = app.state.supervisor = None
    app.state.key_cache = KeyCache(settings.auth_cache_s)
    # the key before the body, then the body bounded in size and time (inside the latency middleware: timed too)
    app.add_middleware(Edge, routes=app.router.routes, max_body_bytes=settings.max_body_bytes,
                       body_timeout_s=settings.body_timeout_s)
    app.add_middleware(Audit)  # outside the edge: its 401s are audited too
    _include_routers(app)
    if not public:
        _add_keyed_docs(app)
    _add_error_handlers(app)
    install_openapi(app)  # every error a route answers, in the schema
    return app


def _lifespan(settings: Settings) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Startup: the state folder, the database migrated, the supervisor and the scheduler started (where this
    process runs jobs); shutdown: both stopped, the database's connections closed."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        if not (settings.input_roots and settings.output_roots):
            (settings.state_dir / "data").mkdir(exist_ok=True)  # the default root
        db = Database(settings.db_url, schema=settings.database_schema)
        await run_in_threadpool(db.migrate)
        supervisor = Supervisor(db, runner_config(settings)) if settings.run_supervisor else None
        app.state.db, app.state.supervisor = db, supervisor
        # the scheduler (service/schedules) runs where the supervisor does: it queues the jobs that one runs
        scheduler = Scheduler(db, settings, wake_jobs=supervisor.wake) if supervisor is not None else None
        app.state.scheduler = scheduler
        if supervisor is not None:
            supervisor.start()
        if scheduler is not None:
            scheduler.start()
        if settings.freeze_gc:
            freeze_gc()
        try:
            yield
        finally:
            if scheduler is not None:
                await run_in_threadpool(scheduler.stop)
            if supervisor is not None:
                await run_in_threadpool(supervisor.stop)
            db.dispose()

    return lifespan


def _include_routers(app: FastAPI) -> None:
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(artifacts.router)  # a job's and a version's files: what trainers stream
    app.include_router(schedules.router)
    app.include_router(mixtures.router)  # pinned blends of jobs and versions (issue 25)
    app.include_router(ablations.router)  # tokenmill ablate as a job (issue 40)
    app.include_router(audit.router)  # who did what, and every refusal (issue 37)
    metrics.install(app)  # /metrics and the HTTP latency middleware
    app.include_router(dashboard.router)  # the page at /


def _add_keyed_docs(app: FastAPI) -> None:
    """Without ``--public-docs``: the schema behind the key, and the docs pages saying how to get them."""

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_key)])
    def openapi() -> dict[str, Any]:
        return app.openapi()

    # a browser cannot send a bearer key when it opens a page: the docs pages are served only with
    # --public-docs; without it they say so (no key needed to read that), instead of a bare 404
    @app.get("/docs", include_in_schema=False)
    @app.get("/redoc", include_in_schema=False)
    def docs_off() -> JSONResponse:
        return JSONResponse({"detail": DOCS_OFF}, status.HTTP_404_NOT_FOUND)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(DataError)
    async def unstorable(request: Request, exc: DataError) -> JSONResponse:
        # a value the database cannot hold that the bounds and U+0000 checks before the store missed: still a
        # 422 of the documented form (a list of problems), saying what it was
        msg, kind = repo.unstorable(exc)
        return JSONResponse({"detail": [{"loc": [], "msg": msg, "type": kind}]}, status.HTTP_422_UNPROCESSABLE_CONTENT)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
            # starlette's Allow names the methods of the first route on the path; a path has one route per
            # method here (GET and POST /v1/schedules), so name them all
            allowed = {m for route in request.app.router.routes if isinstance(route, Route)
                       and route.matches(request.scope)[0] != Match.NONE for m in route.methods or ()}
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(sorted(allowed))}
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = field_problems(exc.errors())
        spec_at = _SPEC_BODIES.get((request.method, request.url.path))
        if spec_at is not None:  # a spec refused in one round: its file checks come with its schema's problems
            body = exc.body
            for key in spec_at[1:]:
                body = body.get(key) if isinstance(body, dict) else None
            settings = request.app.state.settings
            found = await run_in_threadpool(beside_schema, body, settings)
            if spec_at[1:]:  # a schedule's spec: an input that matches nothing yet is each run's to check
                found = [p for p in found if p.kind != NO_MATCH]
            detail += [p.detail(*spec_at) for p in found]
        return JSONResponse({"detail": detail}, status.HTTP_422_UNPROCESSABLE_CONTENT)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        return JSONResponse({"detail": exc.details()}, exc.status_code)

    @app.exception_handler(repo.NotFound)
    async def not_found(request: Request, exc: repo.NotFound) -> JSONResponse:
        if isinstance(exc, repo.Hidden):  # another team's: answered as unknown, audited as what it was
            mark_hidden(request.scope)
        return JSONResponse({"detail": str(exc)}, status.HTTP_404_NOT_FOUND)

    @app.exception_handler(repo.Conflict)
    async def conflict(request: Request, exc: repo.Conflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status.HTTP_409_CONFLICT)

    @app.exception_handler(DBAPIError)
    async def database_down(request: Request, exc: DBAPIError) -> JSONResponse:
        if not exc.connection_invalidated and not _is_operational(exc):
            raise exc
        return JSONResponse({"detail": "the database is unavailable; retry later"},
                            status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": "5"})


#: the requests whose body holds a job spec, and where in it (a job's body is the spec; a schedule's, ``spec``)
_SPEC_BODIES: dict[tuple[str, str], tuple[str, ...]] = {("POST", "/v1/jobs"): ("body",),
                                                        ("POST", "/v1/schedules"): ("body", "spec")}


def _is_operational(exc: DBAPIError) -> bool:
    return isinstance(exc, OperationalError)


def field_problems(errors: Any) -> list[dict[str, Any]]:
    """pydantic's errors as ``{loc, msg, type}`` (:func:`pipeline.problems.from_pydantic`: a validator's own
    message without pydantic's "Value error, " prefix); ``loc`` starts with where it was (``body``, ``query``)."""
    return [from_pydantic(err).detail() for err in errors]


def _version() -> str:
    try:
        return metadata.version("tokenmill")
    except metadata.PackageNotFoundError:
        return "0"
