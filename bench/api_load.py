"""API load: 200 concurrent clients polling job status for 30 s, on SQLite and on PostgreSQL.

**The service.** ``tokenmill serve`` (uvicorn, its supervisor running; ``--workers`` processes, default 1) in a
subprocess on 127.0.0.1, on a store seeded with finished jobs whose events and figures look like a real job's
(stages with drop reasons, phases, shards), so ``GET /v1/jobs/{id}`` returns a full detail (about 2 KB). Every
request carries a bearer key, which the server checks (its key cache, ``Settings.auth_cache_s``, re-reads the
key from the store every 10 s), and the job is read from the store on every request.

**The load model: pollers.** What the goal describes is 200 clients each following a job: a dashboard tab,
a ``tokenmill status`` loop, a training launcher waiting for its data. Each client is one keep-alive HTTP/1.1
connection that asks for its job's status (client i follows job i mod ``--jobs``) every ``--interval``
seconds (default 1 s: twice as often as the dashboard polls a job it shows, every 2 s), starting at a random
offset within the first interval, so 200 clients offer about 200 requests/s in total, spread over time as
independent pollers' requests are. A poller waits for its answer before it asks again; when an answer takes
longer than the interval, the next request goes at once (the achieved rate then falls below the offered one,
and the table shows it: the server is saturated). ``--interval 0`` polls back to back: a throughput test
(closed loop, no think time), not the goal's load.

Latency is from a request's send to its full response; every non-200 answer, an answer that is not the
asked-for job, a timeout (10 s) or a connection error is an error. The clients are a minimal HTTP/1.1 client
on one event loop (``--client httpx`` for httpx), since they share this machine's cores with the server.

**The figures.** Requests/s achieved (against the offered rate), latency percentiles, and the CPU the server
(its processes, not PostgreSQL's) spent per request during the timed window, and the clients' CPU: figures
that the machine's other load disturbs much less than latency, which queueing for a shared CPU dominates.
The peer is the framework itself: the same clients polling ``/healthz`` (no key, no database) on the same
server, for a shorter run, give the floor that uvicorn + FastAPI reach on this machine; the table shows the
job status latency as a ratio of it. Goal: p99 < 50 ms and no error on both stores. The load average before
and after is printed: the latencies mean little when it is high.

    scripts/netns.sh .venv/bin/python bench/api_load.py [--clients 200] [--seconds 30] [--interval 1]
        [--stores sqlite postgresql] [--workers 1] [--client raw|httpx]

Ends with one JSON line: ``p99_ms`` is the worse of the two stores, ``errors`` the errors of all runs.
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

# the repo root instead of bench/ on sys.path, so `service` and `pipeline` import
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from bench.common import emit_json
from pipeline.job import events as ev
from service.runner.summary import fold
from service.store import repo
from service.store.db import Database
from service.store.models import JobState, utcnow

REPO = Path(__file__).resolve().parent.parent
GOAL_P99_MS = 50.0
REQUEST_TIMEOUT_S = 10.0
#: PostgreSQL through its Unix socket, as the tests find it (tests/test_service_store.py); a private schema
PG_URLS = [os.environ["TOKENMILL_BENCH_PG_URL"]] if os.environ.get("TOKENMILL_BENCH_PG_URL") else [
    "postgresql+psycopg://root@/test?host=/var/run/postgresql",
    "postgresql+psycopg://postgres@/test?host=/var/run/postgresql",
]


# ---- the store ------------------------------------------------------------------------------------------------


def job_events(name: str, t0: float, rng: random.Random) -> list[dict[str, Any]]:
    """The events of a finished 5-stage job that wrote 40 shards (what its detail is folded from)."""
    read = rng.randint(50_000, 200_000)
    stages, n = {}, read
    for i, (stage, reason) in enumerate([("read", "malformed_json"), ("normalize", None),
                                         ("gopher_quality", "gopher_quality:symbol_word_ratio"),
                                         ("exact_dedup", "exact_duplicate"), ("near_dedup", "near_duplicate")]):
        dropped = {reason: int(n * rng.uniform(0.01, 0.1))} if reason else {}
        out = n - sum(dropped.values())
        stages[f"{i:02d}-{stage}"] = {"docs_in": n, "docs_out": out, "dropped": dropped, "bytes_in": n * 2000,
                                      "bytes_out": out * 2000, "seconds": round(rng.uniform(5, 50), 3)}
        n = out
    e: list[ev.Event] = [ev.JobStarted(job=name, spec_hash="0" * 64, output="/o", parallelism=2, ts=t0),
                         ev.PhaseChanged(phase="curate", state="started", ts=t0)]
    e += [ev.PhaseProgress(phase="curate", done=read * k // 10, total=None, unit="docs", ts=t0 + k)
          for k in range(1, 11)]
    e += [ev.StageCounters(stages=stages, ts=t0 + 10),
          ev.PhaseChanged(phase="curate", state="finished", seconds=10, ts=t0 + 10),
          ev.PhaseChanged(phase="tokenizer", state="started", ts=t0 + 10),
          ev.PhaseChanged(phase="tokenizer", state="finished", seconds=5, ts=t0 + 15),
          ev.PhaseChanged(phase="write", state="started", ts=t0 + 15)]
    e += [ev.ShardWritten(name=f"shards/shard-{k:06d}.tar", sha256=secrets.token_hex(32), samples=1024,
                          tokens=1024 * 2048, writer="node:1", ts=t0 + 15 + k) for k in range(40)]
    e += [ev.PhaseChanged(phase="write", state="finished", seconds=40, ts=t0 + 55),
          ev.JobFinished(output="/o", shards=40, samples=40 * 1024, tokens=40 * 1024 * 2048, documents=n, seconds=56,
                         ts=t0 + 56)]
    return [ev.to_dict(x) for x in e]


def seed(db: Database, n_jobs: int) -> tuple[str, list[str]]:
    """A key and ``n_jobs`` SUCCEEDED jobs, made as the supervisor makes them (events stored and folded)."""
    rng = random.Random(0)
    db.migrate()
    with db.session() as s:
        _, token = repo.create_key(s, "api-load")
    ids = []
    for i in range(n_jobs):
        spec = {"name": f"load-{i}", "inputs": [{"path": "/data/in/*.jsonl.gz"}],
                "stages": [{"type": t} for t in ("normalize", "gopher_quality", "exact_dedup", "near_dedup")],
                "output": {"path": f"/data/out/load-{i}"}}
        with db.session() as s:
            job, _ = repo.create_job(s, spec, name=spec["name"], spec_hash="0" * 64, output_path=spec["output"]["path"])
        with db.session() as s:
            job, att = repo.start_attempt(s, job.id, run_dir=lambda j, k: f"/nonexistent/{j}/{k}", host="bench")
            records = job_events(job.name, time.time() - 3600, rng)
            repo.append_events(s, job, att.number, records)
            summary = dict(job.summary)
            for rec in records:
                summary = fold(summary, rec)
            job.summary, job.updated_at = summary, utcnow()
            att.outcome, att.exit_code, att.ended_at = "succeeded", 0, utcnow()
            repo.transition(s, job, JobState.SUCCEEDED)
            ids.append(job.id)
    return token, ids


def find_postgres() -> str | None:
    from sqlalchemy import create_engine, text

    for url in PG_URLS:
        engine = create_engine(url, connect_args={"connect_timeout": 3})
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return url
        except Exception:  # noqa: BLE001 - try the next one
            continue
        finally:
            engine.dispose()
    return None


# ---- the server ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(state: Path, db_url: str, schema: str | None, workers: int = 1) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--state-dir", str(state), "--root", str(state / "data"), "--database-url", db_url,
           "--log-level", "warning"] + (["--workers", str(workers)] if workers != 1 else []) \
        + (["--database-schema", schema] if schema else [])
    log = open(state / "serve.log", "wb")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the service exited: {(state / 'serve.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the service did not become ready in 60 s")


def stop_server(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ---- the clients ----------------------------------------------------------------------------------------------


@dataclass
class Run:
    label: str
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    #: CPU seconds the server process (and its children) used during the timed window, and this process (the
    #: clients: their latency includes their own event loop's queue, so it must not be saturated either)
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0

    def cpu_ms_per_request(self, client: bool = False) -> float:
        n = len(self.latencies_ms) + self.errors
        return (self.client_cpu_s if client else self.server_cpu_s) * 1000 / n if n else float("nan")

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies_ms)
        return xs[max(0, math.ceil(q * len(xs)) - 1)] if xs else float("nan")

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


class RawConn:
    """One keep-alive HTTP/1.1 connection speaking just enough of the protocol for a GET and its
    ``Content-Length`` answer: about a tenth of httpx's CPU per request, so the 200 clients, which share
    this machine's cores with the server, neither take the server's CPU nor queue in their own event loop
    (a dashboard or CLI polling a real service runs on its own machine)."""

    def __init__(self, base: str, headers: dict[str, str]):
        url = httpx.URL(base)
        self.host, self.port = url.host, url.port
        self.head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": f"{url.host}:{url.port}", **headers}.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, path: str) -> tuple[int, bytes]:
        try:
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            assert self.reader is not None
            self.writer.write(f"GET {path} HTTP/1.1\r\n{self.head}\r\n".encode())
            head = await self.reader.readuntil(b"\r\n\r\n")
            m = _CONTENT_LENGTH.search(head)
            if not head.startswith(b"HTTP/1.1 ") or m is None:
                raise ConnectionError(f"not an HTTP/1.1 answer with a Content-Length: {head[:80]!r}")
            return int(head[9:12]), await self.reader.readexactly(int(m.group(1)))
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer, self.reader = None, None


_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)


class HttpxConn:
    """The same through httpx (``--client httpx``): what a Python client of the API would use."""

    def __init__(self, base: str, headers: dict[str, str], tls: ssl.SSLContext):
        self.c = httpx.AsyncClient(base_url=base, headers=headers, timeout=REQUEST_TIMEOUT_S, verify=tls,
                                   limits=httpx.Limits(max_connections=1))

    async def get(self, path: str) -> tuple[int, bytes]:
        r = await self.c.get(path)
        return r.status_code, r.content

    async def aclose(self) -> None:
        await self.c.aclose()


async def client(c: RawConn | HttpxConn, paths: list[str], check: Callable[[str, bytes], bool], run: Run,
                 start: float, end: float, interval: float, rng: random.Random) -> None:
    await c.get(paths[0])  # opens the connection before the clock starts (not counted)
    due = start + rng.uniform(0, interval)
    while True:
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)
        if time.perf_counter() >= end:
            return
        t = time.perf_counter()
        path = rng.choice(paths)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                status, body = await c.get(path)
            if status != 200:
                run.error(f"HTTP {status}")
            elif not check(path, body):
                run.error("unexpected body")
            else:
                run.latencies_ms.append((time.perf_counter() - t) * 1000)
        except (OSError, EOFError, TimeoutError, ValueError, httpx.HTTPError) as exc:  # ValueError: a bad body
            run.error(type(exc).__name__)
        # a poller asks again one interval after it last asked, or at once if the answer took longer
        due = max(due + interval, time.perf_counter()) if interval else time.perf_counter()


def job_answer(path: str, body: bytes) -> bool:
    return json.loads(body).get("id") == path.rsplit("/", 1)[1]


def health_answer(path: str, body: bytes) -> bool:
    return json.loads(body) == {"status": "ok"}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live children (uvicorn workers, if any)."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


async def measure_cpu(pid: int, start: float, end: float, run: Run) -> None:
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    before, mine = cpu_seconds(pid), time.process_time()
    await asyncio.sleep(max(0.0, end - time.perf_counter()))
    run.server_cpu_s, run.client_cpu_s = cpu_seconds(pid) - before, time.process_time() - mine


async def load(base: str, headers: dict[str, str], paths: list[str], check: Callable[[str, bytes], bool],
               label: str, args: argparse.Namespace, seconds: float, server_pid: int) -> Run:
    run = Run(label)
    if args.client == "raw":
        conns: list[RawConn | HttpxConn] = [RawConn(base, headers) for _ in range(args.clients)]
    else:
        # one TLS context for all (httpx builds one per client otherwise, ~20 ms of CPU each; nothing here is TLS)
        tls = ssl.create_default_context()
        conns = [HttpxConn(base, headers, tls) for _ in range(args.clients)]
    try:
        start = time.perf_counter() + 2.0 + args.clients / 200  # after every client's first connection
        rngs = [random.Random(i) for i in range(args.clients)]
        await asyncio.gather(measure_cpu(server_pid, start, start + seconds, run),
                             *(client(c, [paths[i % len(paths)]], check, run, start, start + seconds, args.interval,
                                      rngs[i]) for i, c in enumerate(conns)))
        run.seconds = time.perf_counter() - start
    finally:
        await asyncio.gather(*(c.aclose() for c in conns))
    return run


# ---- main -----------------------------------------------------------------------------------------------------


def run_loop(coro: Coroutine[Any, Any, Run]) -> Run:
    """On uvloop when it is installed (as the service's extra installs it), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def bench_store(store: str, args: argparse.Namespace, tmp: Path) -> list[Run]:
    state = tmp / store
    (state / "data").mkdir(parents=True)
    schema = None
    if store == "sqlite":
        url = f"sqlite:///{state / 'tokenmill.db'}"
    else:
        url = find_postgres()
        if url is None:
            raise SystemExit("no PostgreSQL server answers (TOKENMILL_BENCH_PG_URL, or the local Unix socket)")
        schema = f"tm_bench_{secrets.token_hex(4)}"
    db = Database(url, schema=schema)
    token, ids = seed(db, args.jobs)
    proc, base = start_server(state, url, schema, args.workers)
    runs = []
    try:
        auth = {"Authorization": f"Bearer {token}"}
        runs.append(run_loop(load(base, auth, [f"/v1/jobs/{i}" for i in ids], job_answer,
                                  f"{store}: GET /v1/jobs/{{id}}", args, args.seconds, proc.pid)))
        if store == args.stores[0]:  # the framework's floor, once (it touches no database)
            runs.append(run_loop(load(base, {}, ["/healthz"], health_answer, "floor: GET /healthz", args,
                                      args.floor_seconds, proc.pid)))
    finally:
        stop_server(proc)
        db.drop_schema()
        db.dispose()
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--floor-seconds", type=float, default=10.0, help="length of the /healthz run")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between a client's requests (0: none)")
    p.add_argument("--jobs", type=int, default=20, help="finished jobs in the store; client i polls job i mod this")
    p.add_argument("--workers", type=int, default=1, help="the server's processes (tokenmill serve --workers)")
    p.add_argument("--client", choices=["raw", "httpx"], default="raw",
                   help="raw: a minimal HTTP/1.1 client (little CPU); httpx: what a Python client would use")
    p.add_argument("--stores", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    args = p.parse_args(argv)

    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="tm-api-load-"))
    try:
        runs = [r for store in args.stores for r in bench_store(store, args, tmp)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()

    floor = next((r for r in runs if r.label.startswith("floor")), None)
    offered = f"offered {args.clients / args.interval:.0f} requests/s" if args.interval else "back to back"
    print(f"\n{args.clients} clients ({args.client}), one request each every {args.interval:g} s ({offered}), "
          f"{args.seconds:g} s per store (floor {args.floor_seconds:g} s); server: {args.workers} process(es); "
          f"{os.cpu_count()} CPUs; load average before {load_before[0]:.2f} / after {load_after[0]:.2f} (1 min)\n")
    head = f"{'run':34} {'req/s':>7} {'requests':>8} {'errors':>6} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} " \
           f"{'max ms':>7} {'p99 / floor':>11} {'CPU ms/req: server':>18} {'clients':>7}"
    print(head)
    print("-" * len(head))
    for r in runs:
        ratio = f"{r.pct(0.99) / floor.pct(0.99):.2f}x" if floor and r is not floor else ""
        print(f"{r.label:34} {len(r.latencies_ms) / r.seconds:7.1f} {len(r.latencies_ms):8d} {r.errors:6d} "
              f"{r.pct(0.5):7.2f} {r.pct(0.9):7.2f} {r.pct(0.99):7.2f} {max(r.latencies_ms, default=0):7.1f} "
              f"{ratio:>11} {r.cpu_ms_per_request():18.2f} {r.cpu_ms_per_request(client=True):7.2f}")
        if r.error_kinds:
            print(f"{'':34} errors: {r.error_kinds}")
    stores = [r for r in runs if not r.label.startswith("floor")]
    worst = max(r.pct(0.99) for r in stores)
    errors = sum(r.errors for r in runs)
    ok = worst < GOAL_P99_MS and errors == 0
    print(f"\ngoal p99 < {GOAL_P99_MS:g} ms and 0 errors: {'met' if ok else 'NOT met'} (worst p99 {worst:.2f} ms)")
    result: dict[str, Any] = {"bench": "api_load", "clients": args.clients, "seconds": args.seconds,
                              "interval_s": args.interval, "workers": args.workers, "client": args.client}
    for r in stores:
        store = r.label.split(":")[0]
        result[f"{store}_p50_ms"], result[f"{store}_p99_ms"] = round(r.pct(0.5), 2), round(r.pct(0.99), 2)
        result[f"{store}_rps"] = round(len(r.latencies_ms) / r.seconds, 1)
        result[f"{store}_server_cpu_ms_per_req"] = round(r.cpu_ms_per_request(), 2)
        result[f"{store}_client_cpu_ms_per_req"] = round(r.cpu_ms_per_request(client=True), 2)
    if floor:
        result["floor_p99_ms"] = round(floor.pct(0.99), 2)
    result.update(p99_ms=round(worst, 2), errors=errors, goal_p99_ms=GOAL_P99_MS, goal_met=ok,
                  load_avg_1m_before=round(load_before[0], 2), load_avg_1m_after=round(load_after[0], 2))
    emit_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
