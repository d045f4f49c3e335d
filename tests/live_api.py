"""The API served for real and fuzzed with every schemathesis check, on any store.

:func:`live_api` starts the app as ``tokenmill serve --workers N`` starts each of its processes (uvicorn's
factory, settings through the environment) on 127.0.0.1, API only (no supervisor: the jobs the fuzzing
creates stay queued), with a key, a finished job with events, and an input and an output root.
:func:`run_schemathesis` runs ``schemathesis run --checks all`` against it: the coverage, fuzzing and stateful
phases, every check (no 5xx, documented statuses, content types and bodies, schema-valid requests accepted,
invalid ones refused, the key enforced, Allow on 405, a created resource found and a deleted one gone), with a
fixed number of examples per operation and a fixed seed (a run fails only on a regression, not by chance).
tests/schemathesis_hooks.py points valid specs into the roots and records every response's status.

What schemathesis is told beyond the schema (``CONFIG``), each for a reason:

- a 422 for a schema-valid body is let through schemathesis on the four operations that take a spec, and the
  test then checks each of its problems (:func:`beyond_the_schema`): only the rules no JSON schema states may
  be among them (:func:`stated_nowhere`: a stage's params compared with one another, the files a spec names,
  a cron expression's values, a mixture's unique source names). The rules across fields are in the schema
  (``tokenizer: null`` needs ``output.documents``, a schedule's dedup stage, the stage types and each one's
  ``params``, one annotating stage per ``meta.filters`` key, no U+0000, this server's CPU cap and
  Ray address; an output's ``validation``: one of ``share`` / ``documents``, with a tokenizer, without
  ``split_by``; a mixture source's one of ``job`` / ``schedule`` and one of ``weight`` / ``tokens``), a source
  that does not exist is a 404 and an update naming another folder than its schedule's a 409; every other
  operation's rules are all in the schema;
- ``GET .../events`` is aimed at the finished job: a queued job's stream lasts until the job ends, and a random
  id only ever gets the 404;
- links are the schema's own, none inferred (an inferred one could lead to a queued job's event stream).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from pipeline.mixture_spec import DUPLICATE_NAME
from pipeline.problems import ACROSS_PARAMS, NO_MATCH, PREFLIGHT
from service.api.app import SETTINGS_ENV
from service.settings import Settings
from service.store import repo
from service.store.db import Database
from service.store.models import JobState
from tests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")
#: positive_data_acceptance's default statuses, and 422 (each of its problems checked: :func:`beyond_the_schema`)
SPEC_STATUSES = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]
CONFIG = f"""
[[operations]]
include-name = ["POST /v1/jobs", "POST /v1/schedules", "PATCH /v1/schedules/{{schedule_id}}", "POST /v1/mixtures"]
checks.positive_data_acceptance.expected-statuses = {SPEC_STATUSES}

[[operations]]
include-name = "GET /v1/jobs/{{job_id}}/events"
parameters = {{ job_id = "{{finished_job}}" }}

[phases.stateful.inference]
algorithms = []
"""


@dataclass(frozen=True)
class Live:
    url: str
    token: str
    finished_job: str
    inputs: str  # a glob matching the input root's file
    output_root: Path


def _finished_job(db: Database) -> str:
    """A SUCCEEDED job with a few events, as the supervisor leaves one (its output is not in the roots)."""
    with db.session() as s:
        job, _ = repo.create_job(s, {"name": "fuzzed"}, name="fuzzed", spec_hash="h" * 64, output_path="/data/fuzzed")
    with db.session() as s:
        job, _ = repo.start_attempt(s, job.id, run_dir=lambda j, n: f"/nonexistent/{j}/{n}", host="test")
        repo.append_events(s, job, 1, [{"type": "phase", "ts": time.time(), "phase": p, "state": "finished"}
                                       for p in ("curate", "tokenizer", "write")])
        repo.transition(s, job, JobState.SUCCEEDED)
        return job.id


def wait_healthy(proc: subprocess.Popen[bytes], base: str, log: Path, timeout: float = 60) -> None:
    """Until ``base/healthz`` answers 200; the server's log in the failure if it exits or never answers."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"the server did not start:\n{log.read_text()[-2000:]}"
        time.sleep(0.1)


@contextmanager
def live_api(tmp: Path, url: str | None = None, schema: str | None = None) -> Iterator[Live]:
    """The API on ``url`` (default a SQLite file in ``tmp``; ``schema``: a PostgreSQL schema) at ``Live.url``."""
    in_root, out_root = tmp / "in_root", tmp / "out_root"
    (in_root / "in").mkdir(parents=True)
    out_root.mkdir()
    (in_root / "in" / "a.jsonl").write_text('{"id": "a", "text": "hello"}\n')
    url = url or f"sqlite:///{tmp / 'live.db'}"
    db = Database(url, schema=schema)
    db.migrate()
    with db.session() as s:
        _, token = repo.create_key(s, "fuzz", role="admin")  # an admin reaches every operation (GET /v1/audit)
    finished = _finished_job(db)
    db.dispose()
    settings = Settings(state_dir=tmp / "state", database_url=url, database_schema=schema, input_roots=(in_root,),
                        output_roots=(out_root,), run_supervisor=False, events_poll_s=0.05)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), SETTINGS_ENV: settings.model_dump_json()}
    with open(tmp / "serve.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "service.api.app:app_from_env",
                                 "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base, tmp / "serve.log")
        yield Live(base, token, finished, str(in_root / "in" / "*.jsonl"), out_root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def run_schemathesis(live: Live, tmp: Path, *, max_examples: int, seed: int = 1,
                     timeout_s: float = 150) -> tuple[subprocess.CompletedProcess[str], Counter[str]]:
    """``schemathesis run --checks all`` against ``live``: the process (its output says what failed) and how
    many responses each ``METHOD path-template status`` got."""
    config = tmp / "schemathesis.toml"
    config.write_text(CONFIG.replace("{finished_job}", live.finished_job))
    statuses = tmp / "statuses.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SCHEMATHESIS_HOOKS": str(HOOKS),
           "TOKENMILL_FUZZ_INPUTS": live.inputs, "TOKENMILL_FUZZ_OUTPUT": str(live.output_root),
           "TOKENMILL_FUZZ_STATUSES": str(statuses), "TOKENMILL_FUZZ_REFUSED": str(tmp / REFUSED)}
    cmd = [str(SCHEMATHESIS), "--config-file", str(config), "run", f"{live.url}/openapi.json", "--checks", "all",
           "-H", f"Authorization: Bearer {live.token}", "--max-examples", str(max_examples), "--seed", str(seed),
           "--generation-database", "none", "--workers", "1", "--request-timeout", "10", "--no-color"]
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout_s)
    seen = Counter(statuses.read_text().splitlines()) if statuses.exists() else Counter()
    return proc, seen


#: where :func:`run_schemathesis` has the hooks write each problem of a 422 to a valid body
REFUSED = "refused.jsonl"


def stated_nowhere(loc: list[str | int], kind: str) -> bool:
    """A spec's rule no JSON schema states, by where a 422 names it below the spec (``body`` or ``body.spec``)
    and its ``type``:

    - under a stage's ``params`` (the schema types them with each stage's ``Params`` model), only a rule that
      compares two of them (``ACROSS_PARAMS``, ``params_across``): near_dedup's bands x rows <= num_perm,
      decontaminate's min_words <= ngram and min_span >= ngram, pii's ``actions`` naming only pattern or
      ``ner_entities`` types and its ``salt`` of 16 bytes or more when an action hashes;
    - the files a spec names (a model, benchmarks, a spaCy pipeline, a tokenizer: ``preflight``, ``no_match``);
    - a cron expression's field values and dates (croniter's);
    - a mixture's source names, unique across its list."""
    rest = loc[2:] if loc[:2] == ["body", "spec"] else loc[1:]
    params = rest[:1] == ["stages"] and rest[2:3] == ["params"]
    return ((params and kind == ACROSS_PARAMS) or kind in (PREFLIGHT, NO_MATCH, DUPLICATE_NAME)
            or rest == ["cron"])


def beyond_the_schema(tmp: Path) -> set[tuple[str, str, tuple[str | int, ...], str]]:
    """Each problem of a 422 to a valid body in :func:`run_schemathesis`'s run in ``tmp`` that is not
    :func:`stated_nowhere` (``(method, path, loc, type)``): a rule the schema should state; none in a good run."""
    path = tmp / REFUSED
    found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {(m, p, tuple(loc), kind) for m, p, loc, kind in found if not stated_nowhere(loc, kind)}
