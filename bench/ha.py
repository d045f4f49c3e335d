"""Control plane availability (issue 41): two replicas on PostgreSQL, the leader SIGKILLed and restarted 3 times.

**The setup** (real processes, tests/ha_cluster.py): a local Ray head with its Jobs API (every job's driver
runs on the cluster, so a replica's death does not stop a job); two ``tokenmill serve`` replicas on one fresh
PostgreSQL schema, each with its own state folder, with the default lease (``TOKENMILL_LEASE_S``) unless
``--lease-s``; a schedule firing every minute (``* * * * *``) whose input folder gets a new file each minute
(so its runs make jobs); ``--jobs`` jobs submitted at the start and one more just before each kill (so a job
is in flight at each kill).

**The load.** ``--pollers`` clients, half on each replica, each making one request every ``--interval``
seconds, all idempotent: ``GET /v1/jobs/{id}`` of a known job, ``GET /v1/jobs``, and ``POST /v1/jobs`` of a
submitted job's spec with its ``Idempotency-Key`` (the same job back). A request that gets no answer or a 5xx
is sent once more to the other replica, as a client with two addresses (or a proxy) does; latency is from
the first send to the final answer.

**The kills.** At ``--kill-at`` seconds the replica leading the supervisor (``GET /readyz``) is SIGKILLed;
once the other replica leads every loop the killed one led, the killed one is started again (same port).

**The figures.** ``takeover_s``: the longest time, over the kills, from the kill until the other replica
leads (goal <= 15); ``lost_jobs``: jobs (submitted or fired) not SUCCEEDED at the end (goal 0);
``duplicate_fires``: schedule runs beyond one per cron slot, or for no slot (goal 0), and ``missed_fires``, slots
that passed without a run; ``failed_requests``: requests that failed even after the retry (goal 0);
``retried_requests``; ``p99_ms`` and ``requests``.

    scripts/netns.sh .venv/bin/python bench/ha.py [--seconds 270] [--pollers 8] [--interval 0.5]
        [--lease-s S --variant lease_S]

Ends with one JSON line, saved to ``bench/results/ha_<machine>.json``.
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

# the repo root instead of bench/ on sys.path, so `service`, `pipeline` and `tests` import
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import itertools
import json
import random
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from bench.common import emit_json
from service.settings import LEASE_S
from service.store import repo
from service.store.db import Database
from tests.corpus_fixtures import make_text, write_jsonl
from tests.ha_cluster import Replica, base_env, pg_schema, ray_head, serve_args, wait_for
from tests.test_service_store import _find_postgres

GOAL_TAKEOVER_S = 15.0
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
REQUEST_TIMEOUT_S = 10.0


def _spec(root: Path, inputs: str, out: str, name: str) -> dict[str, Any]:
    return {"name": name, "inputs": [{"path": str(root / inputs / "*.jsonl")}],
            "stages": [{"type": "normalize"}, {"type": "exact_dedup"}],
            "tokenizer": {"train": {"vocab_size": 300, "sample_docs": 100}},
            "packing": {"seq_len": 64, "range_docs": 100},
            "output": {"path": str(root / out), "samples_per_shard": 64},
            "execution": {"parallelism": 1, "batch_size": 64}}


def _docs(rng: random.Random, prefix: str, n: int) -> list[dict[str, Any]]:
    return [{"id": f"{prefix}-{i}", "text": make_text(rng, rng.choice([20, 60, 120]))} for i in range(n)]


@dataclass
class Load:
    """What the pollers saw: each request's latency, the retried and the failed ones."""

    latencies_ms: list[float] = field(default_factory=list)
    retried: int = 0
    failed: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Client:
    """One client with both replicas' addresses: a request to its own, then once to the other on no answer or 5xx."""

    def __init__(self, replicas: list[Replica], first: int, token: str, load: Load):
        self.replicas, self.first, self.load = replicas, first, load
        self.http = [httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=REQUEST_TIMEOUT_S)
                     for _ in replicas]

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response | None:
        start, why = time.perf_counter(), ""
        for n in range(2):
            i = (self.first + n) % len(self.replicas)
            try:
                r = self.http[i].request(method, self.replicas[i].url + path, **kw)
                if r.status_code < 500:
                    with self.load.lock:
                        self.load.latencies_ms.append((time.perf_counter() - start) * 1000)
                        self.load.retried += n
                    return r
                why = f"{r.status_code} {r.text[:200]}"
            except httpx.TransportError as exc:
                why = f"{type(exc).__name__}: {exc}"
        with self.load.lock:
            self.load.failed.append(f"{method} {path}: {why}")
        return None

    def close(self) -> None:
        for h in self.http:
            h.close()


@dataclass
class Submitted:
    key: str
    spec: dict[str, Any]
    job_id: str


def submit(client: Client, spec: dict[str, Any], key: str) -> Submitted:
    r = client.request("POST", "/v1/jobs", json=spec, headers={"Idempotency-Key": key})
    assert r is not None and r.status_code in (200, 201), r and r.text
    return Submitted(key, spec, r.json()["id"])


def poll(client: Client, jobs: list[Submitted], interval: float, stop: threading.Event, seed: int) -> None:
    """Idempotent requests every ``interval`` seconds: a job's status, the job list, a repeated submission."""
    rng = random.Random(seed)
    stop.wait(rng.uniform(0, interval))
    while not stop.is_set():
        job = rng.choice(list(jobs))
        pick = rng.random()
        if pick < 0.6:
            r = client.request("GET", f"/v1/jobs/{job.job_id}")
            ok = r is None or (r.status_code == 200 and r.json()["id"] == job.job_id)
        elif pick < 0.8:
            r = client.request("GET", "/v1/jobs", params={"limit": 20})
            ok = r is None or r.status_code == 200
        else:
            r = client.request("POST", "/v1/jobs", json=job.spec, headers={"Idempotency-Key": job.key})
            ok = r is None or (r.status_code == 200 and r.json()["id"] == job.job_id)
        if not ok:
            assert r is not None
            with client.load.lock:
                client.load.failed.append(f"wrong answer {r.status_code}: {r.text[:200]}")
        stop.wait(interval)


def leaders(replica: Replica) -> dict[str, bool] | None:
    try:
        return httpx.get(f"{replica.url}/readyz", timeout=2).json()["leader"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def kill_leader(replicas: list[Replica]) -> float:
    """SIGKILL the replica leading the supervisor; seconds until the other leads what it led; start it again."""
    led = {r.name: leaders(r) or {} for r in replicas}
    leader = next(r for r in replicas if led[r.name].get("supervisor"))
    other = next(r for r in replicas if r is not leader)
    loops = [loop for loop, yes in led[leader.name].items() if yes]
    killed = time.monotonic()
    leader.kill()
    wait_for(f"replica {other.name} to lead {loops}",
             lambda: all((leaders(other) or {}).get(loop) for loop in loops), 120, every_s=0.1)
    took = time.monotonic() - killed
    leader.start()
    return took


def schedule_runs(client: Client, sid: str) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    before: int | None = None
    while True:
        r = client.request("GET", f"/v1/schedules/{sid}/runs",
                           params={"limit": 500, **({"before": before} if before else {})})
        assert r is not None and r.status_code == 200, r and r.text
        body = r.json()
        runs += body["items"]
        before = body["next_cursor"]
        if before is None:
            return runs


def fires(runs: list[dict[str, Any]], first_slot: datetime, until: datetime) -> tuple[int, int]:
    """``(duplicate, missed)``: runs beyond one per cron minute from ``first_slot`` to ``until`` (or for no such
    minute), and those minutes that have no run."""
    slots = {first_slot.timestamp() + 60 * k for k in range(int((until - first_slot).total_seconds() // 60) + 1)}
    at = [datetime.fromisoformat(r["fire_at"]).replace(tzinfo=UTC).timestamp() for r in runs]
    per_slot = {s: at.count(s) for s in slots}
    duplicate = sum(max(0, n - 1) for n in per_slot.values()) + sum(1 for t in at if t not in slots)
    return duplicate, sum(1 for n in per_slot.values() if n == 0)


def explain(url: str, schema: str, job_id: str) -> None:
    """A job that did not succeed: its attempts and last events, on stderr."""
    db = Database(url, schema=schema)
    with db.session() as s:
        atts = [(a.number, a.outcome, a.run_dir) for a in repo.attempts_of(s, job_id)]
        last = [(e.seq, e.attempt, e.type, json.dumps(e.data)[:200]) for e in repo.events_after(s, job_id, 0, 1000)]
    db.dispose()
    print(f"job {job_id}: attempts {atts}", *last[-12:], sep="\n  ", file=sys.stderr)


def run(args: argparse.Namespace) -> dict[str, Any]:
    url, why = _find_postgres()
    if url is None:
        raise SystemExit(f"no PostgreSQL server reachable: {why}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-ha-"))
    root = tmp / "data"
    rng = random.Random(3)
    for k in range(args.jobs + len(args.kill_at)):
        write_jsonl(root / f"in{k}" / "a.jsonl", _docs(rng, f"j{k}", 300))
    write_jsonl(root / "sched_in" / "part-0.jsonl", _docs(rng, "s0", 200))
    load, stop = Load(), threading.Event()
    with ray_head(tmp, num_cpus=2) as head, pg_schema(url, "bench-ha") as (schema, token):
        env = {**base_env(), **head.auth}
        serve = [*serve_args(url, schema, [root], head.url, args.lease_s), "--max-running", "2"]
        replicas = [Replica(n, tmp, serve, env) for n in "ab"]
        clients: list[Client] = []
        try:
            for r in replicas:
                r.launch()
            head.wait()
            for r in replicas:
                r.wait_ready()
            admin = Client(replicas, 0, token, load)
            clients.append(admin)
            made = admin.request("POST", "/v1/schedules", json={
                "cron": "* * * * *", "spec": _spec(root, "sched_in", "scheduled", "ha-scheduled")})
            assert made is not None and made.status_code == 201, made and made.text
            sid = made.json()["id"]
            first_slot = datetime.fromisoformat(made.json()["next_fire_times"][0]).replace(tzinfo=UTC)
            jobs = [submit(admin, _spec(root, f"in{k}", f"out{k}", f"ha-{k}"), f"ha-bench-{k}")
                    for k in range(args.jobs)]
            clients += [Client(replicas, i % 2, token, load) for i in range(args.pollers)]
            threads = [threading.Thread(target=poll, args=(c, jobs, args.interval, stop, i), daemon=True)
                       for i, c in enumerate(clients[1:])]
            for t in threads:
                t.start()
            start, takeovers, files = time.monotonic(), [], itertools.count(1)
            kills = sorted(args.kill_at)
            while (elapsed := time.monotonic() - start) < args.seconds:
                if kills and elapsed >= kills[0]:
                    k = args.jobs + len(takeovers)
                    jobs.append(submit(admin, _spec(root, f"in{k}", f"out{k}", f"ha-{k}"), f"ha-bench-{k}"))
                    time.sleep(3)  # under way
                    takeovers.append(round(kill_leader(replicas), 2))
                    print(f"kill {len(takeovers)} at {elapsed:.0f} s: taken over in {takeovers[-1]} s",
                          file=sys.stderr, flush=True)
                    kills.pop(0)
                if datetime.now(UTC).second == 30:  # a new input file each minute, away from the slots
                    n = next(files)
                    write_jsonl(root / "sched_in" / f"part-{n}.jsonl", _docs(rng, f"s{n}", 200))
                    time.sleep(1)
                time.sleep(0.2)
            until = datetime.now(UTC)
            stop.set()
            for t in threads:
                t.join(REQUEST_TIMEOUT_S * 2 + args.interval)
            runs = schedule_runs(admin, sid)
            admin.request("POST", f"/v1/schedules/{sid}/pause")
            ids = [j.job_id for j in jobs] + [r["job_id"] for r in runs if r["job_id"]]

            def states() -> dict[str, str]:
                out = {}
                for job_id in ids:
                    r = admin.request("GET", f"/v1/jobs/{job_id}")
                    out[job_id] = r.json()["state"] if r is not None and r.status_code == 200 else "?"
                return out

            try:
                final = wait_for("every job to end", lambda: (s := states()) and all(v in TERMINAL for v in s.values())
                                 and s, args.drain_s, every_s=2)
            except AssertionError:
                final = states()
            duplicate, missed = fires(runs, first_slot, until)
            for job_id in (j for j, v in final.items() if v != "SUCCEEDED"):
                explain(url, schema, job_id)
        finally:
            stop.set()
            for r in replicas:
                r.kill()
            for c in clients:
                c.close()
    if all(v == "SUCCEEDED" for v in final.values()):
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"kept {tmp} (the replicas' logs)", file=sys.stderr)
    lat = sorted(load.latencies_ms)
    result = {
        "bench": "ha",
        "takeover_s": max(takeovers) if takeovers else None,
        "takeovers_s": takeovers,
        "lease_s": args.lease_s or LEASE_S,
        "lost_jobs": sum(1 for v in final.values() if v != "SUCCEEDED"),
        "jobs": len(final),
        "duplicate_fires": duplicate,
        "missed_fires": missed,
        "schedule_runs": len(runs),
        "failed_requests": len(load.failed),
        "retried_requests": load.retried,
        "requests": len(lat) + len(load.failed),
        "p50_ms": round(lat[len(lat) // 2], 1) if lat else None,
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1) if lat else None,
        "goal": {"takeover_s": GOAL_TAKEOVER_S, "lost_jobs": 0, "duplicate_fires": 0, "failed_requests": 0},
    }
    if load.failed:
        print("failed requests (first 5):", *load.failed[:5], sep="\n  ", file=sys.stderr)
    not_ok = {k: v for k, v in final.items() if v != "SUCCEEDED"}
    if not_ok:
        print("jobs not SUCCEEDED:", json.dumps(not_ok), file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=270, help="how long the load and the kills last")
    p.add_argument("--pollers", type=int, default=8)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between one poller's requests")
    p.add_argument("--jobs", type=int, default=3, help="jobs submitted at the start")
    p.add_argument("--kill-at", type=float, nargs="+", default=[45, 120, 195],
                   help="seconds into the run at which the leader is killed (and then restarted)")
    p.add_argument("--lease-s", type=float, default=None, help="the replicas' lease (default: theirs)")
    p.add_argument("--drain-s", type=float, default=150, help="at most this long for the jobs to end afterwards")
    p.add_argument("--out", type=Path, default=None, help="a trial run's result file (default: bench/results)")
    p.add_argument("--variant", help="record the run as this named variant beside the headline run (a lease)")
    args = p.parse_args(argv)
    emit_json(run(args), args.out, variant=args.variant)
    return 0


if __name__ == "__main__":
    sys.exit(main())
