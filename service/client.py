"""The control plane from a terminal: ``tokenmill serve``, ``submit``, ``status``, ``follow``, ``logs``, ``cancel``,
``retry``, ``apikey`` and ``audit``.

Each command is a ``main_<name>(argv) -> int`` (``service/commands/<name>.py`` exposes it as the ``main`` that
``tokenmill <name>`` calls). The HTTP commands take ``--server URL`` (default ``$TOKENMILL_SERVER``, else
``http://127.0.0.1:8000``) and ``--api-key`` (default ``$TOKENMILL_API_KEY``). Exit codes follow
``tokenmill run``: 0 done, 1 a failure of the program, the machine or the server (5xx, no answer), 2 a request
the server refused (4xx: a bad spec, a path outside the roots, a missing key), 130 a cancelled job
(``follow`` exits with its job's outcome: 0 SUCCEEDED, 130 CANCELLED, 2 FAILED for a bad spec or input, 1 else).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn
from pydantic import ValidationError
from uvicorn.supervisors.multiprocess import Multiprocess

from pipeline.job import events as ev
from pipeline.problems import SpecError, problems_of
from service.roles import DEFAULT_ROLE, Role

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_CANCELLED = 0, 1, 2, 130
DEFAULT_SERVER = "http://127.0.0.1:8000"
#: seconds a request may take (a submit runs the spec's file checks on the server)
TIMEOUT_S = 60.0
#: seconds ``tokenmill serve --workers N`` waits for a first worker to start before it stops watching for one
READY_S = 120.0
#: what every command taking a job's id says of it
JOB_ID_HELP = "the job's id, as `tokenmill submit` printed it"
#: seconds between reconnections of ``follow`` after the stream broke (the server restarting)
RECONNECT_S = 1.0


class ClientError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def _err(msg: str, code: int = EXIT_USAGE) -> int:
    for line in str(msg).splitlines():
        print(f"error: {line}", file=sys.stderr, flush=True)
    return code


# ---- serve ------------------------------------------------------------------------------------------------


def main_serve(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tokenmill serve", description="Run the control plane (REST API + job runner).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--state-dir", help="jobs' logs and events, the default SQLite file ($TOKENMILL_STATE_DIR)")
    _db_args(p)
    p.add_argument("--root", action="append", default=[], metavar="[TEAM=]DIR",
                   help="a folder jobs may read and write (repeat; $TOKENMILL_ROOTS); TEAM=DIR: one of that team's "
                        "own roots, which its jobs use instead of the others")
    p.add_argument("--input-root", action="append", default=[], metavar="DIR", help="a folder jobs may only read")
    p.add_argument("--output-root", action="append", default=[], metavar="DIR", help="a folder jobs may write")
    p.add_argument("--max-running", type=int, help="jobs at once (default 1)")
    p.add_argument("--ray-address", help="run every job on this Ray cluster (default: a local Ray per job)")
    p.add_argument("--ray-jobs-url", help="submit every job to this Ray Jobs API, e.g. http://head:8265 "
                   "($TOKENMILL_RAY_JOBS_URL; the state dir must be shared with the head)")
    p.add_argument("--ray-start-timeout-s", type=float, help="seconds a job has to start or join Ray, else it "
                   "ends FAILED infra (default 120; $TOKENMILL_RAY_START_TIMEOUT_S)")
    p.add_argument("--job-cpus", type=int, help="CPUs of each job's local Ray when its spec leaves "
                   "execution.num_cpus out (default: all)")
    p.add_argument("--max-job-cpus", type=int, help="the most CPUs a spec may ask (execution.num_cpus, "
                   "execution.parallelism; more gets 422); default: a local Ray, this machine's CPUs or "
                   "--job-cpus if more; a cluster, no limit ($TOKENMILL_MAX_JOB_CPUS)")
    p.add_argument("--max-body-bytes", type=int)
    p.add_argument("--public-docs", action="store_true", help="serve /docs and /openapi.json without a key")
    p.add_argument("--head-timeout-s", type=float, help="seconds a connection has for a request's line and "
                   "headers, else 408 and closed (default 10; $TOKENMILL_HEAD_TIMEOUT_S)")
    p.add_argument("--body-timeout-s", type=float, help="seconds a request has for its body after the headers, "
                   "else 408 and closed (default 10; $TOKENMILL_BODY_TIMEOUT_S)")
    p.add_argument("--keepalive-s", type=int, help="seconds an idle connection stays open between requests "
                   "(default 5; $TOKENMILL_KEEPALIVE_S)")
    p.add_argument("--max-connections", type=int, help="connections and requests in flight per process; more get "
                   "503 (default 1000; $TOKENMILL_MAX_CONNECTIONS)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--workers", type=int, default=1, help="API processes on the port (default 1); one of them "
                   "runs the jobs and the schedules (a lock in the state folder decides which)")
    args = p.parse_args(argv)
    if args.workers < 1:
        return _err("--workers: at least 1")

    # lazy: fastapi, sqlalchemy and the routers (1 s), only to serve
    from service.api.app import SETTINGS_ENV, create_app
    from service.api.server import uvicorn_options

    try:
        from service.settings import team_root, team_roots  # lazy: see _settings

        shared = [r for r in args.root if team_root(r) is None]
        settings = _settings(args, input_roots=tuple(shared + args.input_root) or None,
                             output_roots=tuple(shared + args.output_root) or None,
                             team_roots=team_roots(args.root) or None,
                             max_running=args.max_running, ray_address=args.ray_address,
                             ray_jobs_url=args.ray_jobs_url, ray_start_timeout_s=args.ray_start_timeout_s,
                             job_cpus=args.job_cpus,
                             max_job_cpus=args.max_job_cpus,
                             max_body_bytes=args.max_body_bytes, public_docs=args.public_docs or None,
                             head_timeout_s=args.head_timeout_s, body_timeout_s=args.body_timeout_s,
                             keepalive_s=args.keepalive_s, max_connections=args.max_connections,
                             freeze_gc=True)
    except ValueError as exc:
        return _err(str(exc))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    roots = settings.roots()
    print(f"tokenmill serve: http://{args.host}:{args.port}  state {settings.state_dir.resolve()}  "
          f"read roots {', '.join(map(str, roots.read))}  write roots {', '.join(map(str, roots.write))}",
          file=sys.stderr, flush=True)
    common: dict[str, Any] = {"host": args.host, "port": args.port, "log_level": args.log_level,
                              "timeout_graceful_shutdown": 5, **uvicorn_options(settings)}
    if args.workers == 1:
        server = _ReadyServer(uvicorn.Config(create_app(settings), **common))
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn raises the SIGINT it caught again once it stopped
            server.run()
        return EXIT_OK if server.started else EXIT_FAILURE  # not started: the lifespan or the bind failed (logged)
    # worker processes import the app: they get the settings through the environment
    os.environ[SETTINGS_ENV] = settings.model_dump_json()
    config = uvicorn.Config("service.api.app:app_from_env", factory=True, workers=args.workers, **common)
    sock = config.bind_socket()
    try:
        with contextlib.suppress(KeyboardInterrupt):
            _ReadyWorkers(config, sockets=[sock]).run()
    finally:
        sock.close()
    return EXIT_OK


def _ready(host: str, port: int) -> None:
    """The one stdout line saying the server accepts requests (what a script starting it waits for)."""
    print(f"ready on http://{f'[{host}]' if ':' in host else host}:{port}", flush=True)


class _ReadyServer(uvicorn.Server):
    """uvicorn's server, saying :func:`_ready` once its startup is complete: the lifespan ran (the database is
    migrated, the job runner started) and the socket listens. ``--port 0``: the port the OS gave."""

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            _ready(self.config.host, self.servers[0].sockets[0].getsockname()[1])


class _ReadyWorkers(Multiprocess):
    """uvicorn's ``--workers`` supervisor, saying :func:`_ready` once a worker reports its server started
    (uvicorn's readiness pipe to each worker), waiting at most :data:`READY_S` or until a signal arrives."""

    def init_processes(self) -> None:
        super().init_processes()
        deadline = time.monotonic() + READY_S
        while not self.signal_queue and time.monotonic() < deadline:
            if any(p.is_ready(timeout=0.5) for p in self.processes if p.process.is_alive()):
                _ready(self.config.host, self.sockets[0].getsockname()[1])
                return
            if not any(p.process.is_alive() for p in self.processes):
                return  # every worker failed its startup (logged); uvicorn's supervisor takes it from here
            time.sleep(0.1)


def _db_args(p: argparse.ArgumentParser, after: bool = False) -> None:
    """The database options; ``after``: on an action's parser, where an option not given leaves the value the
    main parser read (argparse's ``SUPPRESS`` default sets nothing), so it may come before or after the action."""
    default: Any = argparse.SUPPRESS if after else None
    p.add_argument("--database-url", default=default,
                   help="SQLAlchemy URL ($TOKENMILL_DATABASE_URL; default a SQLite file)")
    p.add_argument("--database-schema", default=default,
                   help="PostgreSQL schema for the tables ($TOKENMILL_DATABASE_SCHEMA)")


def _store_args(p: argparse.ArgumentParser, after: bool = False) -> None:
    """``--state-dir`` and the database options (see :func:`_db_args` for ``after``)."""
    p.add_argument("--state-dir", default=argparse.SUPPRESS if after else None,
                   help="the service's state folder, whose SQLite file holds the keys ($TOKENMILL_STATE_DIR)")
    _db_args(p, after)


def _settings(args: argparse.Namespace, **overrides: Any) -> Any:
    """The service's settings; :class:`~pipeline.problems.SpecError` (one ``field: message`` line each) if invalid."""
    from service.settings import Settings  # lazy: pulls pipeline.spec (pyarrow, yaml; 0.3 s), not for the HTTP commands

    try:
        return Settings.from_env(state_dir=args.state_dir, database_url=args.database_url,
                                 database_schema=args.database_schema, **overrides)
    except ValidationError as exc:
        raise SpecError(problems_of(exc)) from None


# ---- apikey -----------------------------------------------------------------------------------------------


def main_apikey(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tokenmill apikey", description="Create, list and revoke API keys "
                                "(in the service's database; a key is shown once, at creation). The database "
                                "options go before or after the action.")
    _store_args(p)
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION",
                           help="create (prints the new key), list, or revoke a key")
    c = sub.add_parser("create", help="make a key and print it (shown only now)")
    c.add_argument("--name", required=True, help="who or what uses it")
    c.add_argument("--role", choices=[str(r) for r in Role], default=str(DEFAULT_ROLE),
                   help="admin: everything, every team; member (default): submit and act on its team's jobs, "
                        "schedules and mixtures; reader: read its team's (a training cluster's loader)")
    c.add_argument("--team", default="default", help="the team whose work the key sees and acts on (default: "
                                                     "default, the team keys made before teams belong to)")
    lst = sub.add_parser("list", help="every key: id, state, last use, role, team, name")
    r = sub.add_parser("revoke", help="stop a key working (a server notices within $TOKENMILL_AUTH_CACHE_S)")
    r.add_argument("key_id", help="the key's id, as `tokenmill apikey list` shows it")
    for action in (c, lst, r):  # after the action too: `apikey create --state-dir svc --name me`
        _store_args(action, after=True)
    args = p.parse_args(argv)

    # lazy: sqlalchemy and the store's models (0.3 s), only for apikey
    from service.roles import check_team
    from service.store import repo
    from service.store.db import Database

    if args.action == "create":
        try:
            check_team(args.team)
        except ValueError as exc:
            return _err(f"--team: {exc}")
    try:
        settings = _settings(args)
        db = Database(settings.db_url, schema=settings.database_schema)
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        db.migrate()
        with db.session() as s:
            if args.action == "create":
                key, token = repo.create_key(s, args.name, role=args.role, team=args.team)
                print(token)
                print(f"key {key.id} ({args.name}, {key.role} of team {key.team}) created; it is shown only now: "
                      "store it", file=sys.stderr)
            elif args.action == "list":
                for key in repo.list_keys(s):
                    state = f"revoked {key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "active"
                    used = f"{key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "never"
                    print(f"{key.id}  {state:<24} used {used:<16}  {key.role:<6}  {key.team:<16}  {key.name}")
            else:
                key = repo.revoke_key(s, args.key_id)
                print(f"key {key.id} ({key.name}) revoked")
        db.dispose()
    except repo.NotFound as exc:
        return _err(str(exc))
    except Exception as exc:  # noqa: BLE001 - a database that cannot be reached: one line
        return _err(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", EXIT_FAILURE)
    return EXIT_OK


# ---- HTTP commands ----------------------------------------------------------------------------------------


def _http_parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"tokenmill {prog}", description=description)
    p.add_argument("--server", default=os.environ.get("TOKENMILL_SERVER", DEFAULT_SERVER))
    p.add_argument("--api-key", default=os.environ.get("TOKENMILL_API_KEY"), help="default: $TOKENMILL_API_KEY")
    return p


class Api:
    """A thin httpx client that turns HTTP errors into :class:`ClientError` lines."""

    def __init__(self, server: str, api_key: str | None):
        if not api_key:
            raise ClientError("no API key: pass --api-key or set TOKENMILL_API_KEY", EXIT_USAGE)
        self.client = httpx.Client(base_url=server.rstrip("/"), timeout=TIMEOUT_S,
                                   headers={"Authorization": f"Bearer {api_key}"})

    def request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ClientError(f"{self.client.base_url}: {exc}", EXIT_FAILURE) from None
        _check(r)
        return r

    def events(self, job_id: str, after: int) -> Iterator[tuple[int, str, dict[str, Any]]]:
        """``(id, event, data)`` of the job's server-sent events after ``after``, until the stream ends."""
        headers = {"Last-Event-ID": str(after), "Accept": "text/event-stream"}
        with self.client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers,
                                timeout=httpx.Timeout(TIMEOUT_S, read=None)) as r:
            if r.is_error:
                r.read()
                _check(r)
            fields: dict[str, str] = {}
            for line in r.iter_lines():
                if not line:
                    if "data" in fields:
                        yield int(fields.get("id", after)), fields.get("event", "message"), json.loads(fields["data"])
                    fields = {}
                elif not line.startswith(":"):
                    name, _, value = line.partition(":")
                    fields[name] = value[1:] if value.startswith(" ") else value


def _check(r: Any) -> None:
    if r.status_code < 400:
        return
    try:
        detail = r.json().get("detail")
    except ValueError:
        detail = r.text.strip()
    if isinstance(detail, list):
        lines = [f"{'.'.join(str(x) for x in p.get('loc', [])[1:]) or 'request'}: {p.get('msg')}" for p in detail]
    else:
        lines = [str(detail)]
    msg = "\n".join(f"HTTP {r.status_code}: {line}" for line in lines)
    raise ClientError(msg, EXIT_USAGE if r.status_code < 500 else EXIT_FAILURE)


def _run(fn: Any) -> int:
    try:
        return fn()
    except ClientError as exc:
        return _err(str(exc), exc.code)
    except KeyboardInterrupt:
        return EXIT_CANCELLED


def main_submit(argv: list[str]) -> int:
    p = _http_parser("submit", "Submit a job spec (YAML or JSON; relative paths resolve against its folder). "
                               "Prints the job's id.")
    p.add_argument("spec", help="the job spec file, YAML or JSON; its paths are sent absolute, relative ones "
                                "resolved against its folder (URIs such as s3://... as they are)")
    p.add_argument("--idempotency-key", help="submitting again with this key returns the same job")
    p.add_argument("--follow", action="store_true", help="then follow it to the end (as `tokenmill follow`)")
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    args = p.parse_args(argv)

    def go() -> int:
        from pipeline.spec import load_spec  # lazy: pydantic models, pyarrow and yaml (0.3 s), only to submit

        try:
            spec = load_spec(args.spec)
        except SpecError as exc:
            return _err(str(exc))
        api = Api(args.server, args.api_key)
        headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
        job = api.request("POST", "/v1/jobs", json=spec.model_dump(mode="json"), headers=headers).json()
        print(json.dumps(job, indent=2) if args.json else job["id"], flush=True)
        return _follow(api, job["id"]) if args.follow else EXIT_OK

    return _run(go)


def main_status(argv: list[str]) -> int:
    p = _http_parser("status", "A job's state and figures; without a job id, the latest jobs.")
    p.add_argument("job_id", nargs="?", help="the job's id, as `tokenmill submit` printed it (default: the "
                                             "latest jobs)")
    p.add_argument("--state", action="append", default=[], help="only jobs in this state (repeat)")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    def go() -> int:
        api = Api(args.server, args.api_key)
        if args.job_id:
            job = api.request("GET", f"/v1/jobs/{args.job_id}").json()
            print(json.dumps(job, indent=2) if args.json else _describe(job))
            return EXIT_OK
        page = api.request("GET", "/v1/jobs", params={"state": args.state, "limit": args.limit}).json()
        if args.json:
            print(json.dumps(page, indent=2))
        for job in [] if args.json else page["items"]:
            err = f"  {job['error']['category']}: {job['error']['message']}" if job.get("error") else ""
            print(f"{job['id']}  {job['state']:<10} attempt {job['attempt']}  {job['created_at'][:19]}  "
                  f"{job['name']}{err}")
        return EXIT_OK

    return _run(go)


def _describe(job: dict[str, Any]) -> str:
    lines = [f"job        {job['id']} ({job['name']})", f"state      {job['state']}  attempt {job['attempt']}"]
    if job.get("error"):
        lines.append(f"error      {job['error']['category']}: {job['error']['message']}")
    lines.append(f"output     {job['output_path']}")
    if job.get("phase"):
        lines.append(f"phase      {job['phase']}")
    sh = job.get("shards") or {}
    lines.append(f"shards     {sh.get('done', 0)} done ({sh.get('reused', 0)} kept from an earlier attempt)"
                 f" of {sh.get('total') if sh.get('total') is not None else '?'}")
    if job.get("tokens") is not None:
        lines.append(f"tokens     {job['tokens']:,}  samples {job.get('samples') or 0:,}  "
                     f"documents {job.get('documents') if job.get('documents') is not None else '?'}")
    tp = job.get("throughput") or {}
    if tp.get("docs_per_s") or tp.get("tokens_per_s"):
        lines.append(f"throughput {tp.get('docs_per_s') or 0:,.1f} docs/s  {tp.get('tokens_per_s') or 0:,.1f} tokens/s")
    for st in job.get("stages") or []:
        dropped = ", ".join(f"{k} {v}" for k, v in (st.get("dropped") or {}).items())
        lines.append(f"  {st['stage']:<24} in {st['docs_in']:>9,}  out {st['docs_out']:>9,}"
                     + (f"  dropped: {dropped}" if dropped else ""))
    if job.get("timings"):
        lines.append("seconds    " + "  ".join(f"{k} {v:.1f}" for k, v in job["timings"].items()))
    return "\n".join(lines)


def main_cancel(argv: list[str]) -> int:
    p = _http_parser("cancel", "Cancel a job (a running one stops within seconds; nothing is published).")
    p.add_argument("job_id", help=JOB_ID_HELP)
    args = p.parse_args(argv)
    return _run(lambda: _print_state(Api(args.server, args.api_key).request(
        "POST", f"/v1/jobs/{args.job_id}/cancel").json()))


def main_retry(argv: list[str]) -> int:
    p = _http_parser("retry", "Queue a FAILED or CANCELLED job again; it resumes where it stopped.")
    p.add_argument("job_id", help=JOB_ID_HELP)
    p.add_argument("--follow", action="store_true")
    args = p.parse_args(argv)

    def go() -> int:
        api = Api(args.server, args.api_key)
        _print_state(api.request("POST", f"/v1/jobs/{args.job_id}/retry").json())
        return _follow(api, args.job_id) if args.follow else EXIT_OK

    return _run(go)


def _print_state(job: dict[str, Any]) -> int:
    print(f"{job['id']} {job['state']}", flush=True)
    return EXIT_OK


def main_logs(argv: list[str]) -> int:
    p = _http_parser("logs", "A job process's log (its output and Ray's).")
    p.add_argument("job_id", help=JOB_ID_HELP)
    p.add_argument("--attempt", type=int, help="default: the latest")
    p.add_argument("--tail-bytes", type=int)
    args = p.parse_args(argv)

    def go() -> int:
        params = {k: v for k, v in (("attempt", args.attempt), ("tail_bytes", args.tail_bytes)) if v is not None}
        sys.stdout.write(Api(args.server, args.api_key).request("GET", f"/v1/jobs/{args.job_id}/logs",
                                                                params=params).text)
        sys.stdout.flush()
        return EXIT_OK

    return _run(go)


def main_audit(argv: list[str]) -> int:
    p = _http_parser("audit", "The audit trail, newest first: every mutating request and every refusal "
                              "(an admin key's).")
    p.add_argument("--team", help="only this team's keys")
    p.add_argument("--key-id", help="only this key's")
    p.add_argument("--outcome", choices=("ok", "refused"))
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    def go() -> int:
        params = {k: v for k, v in (("team", args.team), ("key_id", args.key_id), ("outcome", args.outcome),
                                    ("limit", args.limit)) if v is not None}
        page = Api(args.server, args.api_key).request("GET", "/v1/audit", params=params).json()
        if args.json:
            print(json.dumps(page, indent=2))
            return EXIT_OK
        for e in page["items"]:
            who = f"{e['key_id'] or '-'} ({e['key_name'] or '?'}, {e['role'] or '-'} of {e['team'] or '-'})"
            why = f"  {e['detail']}" if e.get("detail") else ""
            print(f"{e['at'][:19]}  {e['outcome']:<7} {e['status']}  {who}  {e['action']}  {e['target']}{why}")
        return EXIT_OK

    return _run(go)


def main_follow(argv: list[str]) -> int:
    p = _http_parser("follow", "Follow a job's events to its end; exits with its outcome.")
    p.add_argument("job_id", help=JOB_ID_HELP)
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    return _run(lambda: _follow(Api(args.server, args.api_key), args.job_id, args.verbose))


def _follow(api: Api, job_id: str, verbose: bool = False) -> int:
    """Render the job's events (the same display as ``tokenmill run``) until it ends; reconnects with
    Last-Event-ID when the stream breaks (a server restart)."""
    from service.progress import PREFIX, make_renderer  # lazy: pipeline.job.fold's pydantic adapters, rich (0.08 s)

    renderer = make_renderer(verbose=verbose)
    last, final = 0, None
    with renderer:
        while final is None:
            try:
                for seq, kind, data in api.events(job_id, last):
                    last = seq
                    if kind == "state":
                        msg = f" ({data['message']})" if data.get("message") else ""
                        print(f"{PREFIX} job {job_id}: {data['state']}, attempt {data.get('attempt')}{msg}",
                              file=sys.stderr, flush=True)
                        final = data if data["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None
                    elif kind in ev.EVENT_TYPES:
                        renderer(ev.from_dict(data))
            except httpx.TransportError as exc:
                print(f"{PREFIX} stream interrupted ({exc}); reconnecting", file=sys.stderr, flush=True)
                time.sleep(RECONNECT_S)
                continue
            if final is None:  # the server ended the stream without a final state: ask again
                time.sleep(RECONNECT_S)
    if final["state"] == "SUCCEEDED":
        return EXIT_OK
    if final["state"] == "CANCELLED":
        return EXIT_CANCELLED
    return EXIT_USAGE if final.get("category") in ("validation", "input") else EXIT_FAILURE


def main(argv: list[str] | None = None) -> int:
    """``python -m service.client COMMAND ...``: the same commands without the ``tokenmill`` entry point."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {name[len("main_"):]: fn for name, fn in globals().items() if name.startswith("main_")}
    if not argv or argv[0] not in commands:
        print(f"usage: python -m service.client {{{','.join(sorted(commands))}}} ...", file=sys.stderr)
        return EXIT_USAGE
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main_apikey", "main_audit", "main_cancel", "main_follow", "main_logs", "main_retry", "main_serve",
           "main_status", "main_submit"]
