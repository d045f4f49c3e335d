"""Shards served to training clusters (issue 12, part 5), over real HTTP: the app under uvicorn on 127.0.0.1.

- a finished job's manifest and a shard downloaded, each body checked against its sha256 (= its ETag);
- HTTP semantics: Range (206 + Content-Range, several ranges, a suffix), 416 for an unsatisfiable range,
  If-None-Match (304), If-Range, HEAD;
- refusals: no key or a bad one (401), names that escape (``..`` sent literally and percent-encoded, an
  absolute path, ``.tokenmill/``: 400), unpublished names (``rejected/``, ``index/``, a file the manifest does
  not list: 404), a symlink out of the output (403), an output outside the service's roots (403, "cross-root"),
  a job not SUCCEEDED (409), an output replaced by another spec's (410);
- the trainer's loader streams from the service with its API key (``TOKENMILL_API_KEY`` or ``bearer_token``)
  and pins ``versions/latest`` to the version its manifest came from;
- a 2-rank CPU ``torchrun`` trains a few steps streaming from the service with an API key.

No Ray: the outputs are synthetic shard sets with the marker a job's commit writes (``publish_output``).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from pipeline.dedup.exact_config import HASH_NAME
from pipeline.dedup.index import index_dir, write_meta
from pipeline.output.shard_set import write_shard_set
from pipeline.shard_format import Manifest
from pipeline.shard_source import ShardSource
from service.api.app import create_app
from service.settings import Settings
from service.store import repo
from service.store.models import JobState, utcnow
from tests.test_loader_dist import torchrun
from training.data import LoaderError, ShardLoader
from training.synthetic import SYNTHETIC, random_packed

SEQ, VOCAB, PER_SHARD = 64, 256, 8


def publish_output(folder: Path, *, n: int = 40, seed: int = 0) -> Manifest:
    """A shard set laid out as a job's commit leaves it: manifest, shards, tokenizer, stats, a dedup index,
    a rejected file, and ``.tokenmill/marker.json`` listing what was published."""
    manifest = write_shard_set(folder, random_packed(n, SEQ, VOCAB, seed=seed), seq_len=SEQ, vocab_size=VOCAB,
                               samples_per_shard=PER_SHARD, **SYNTHETIC)
    (folder / "tokenizer.json").write_text('{"model": "synthetic"}')
    (folder / "stats.json").write_text('{"stages": []}')
    (folder / "rejected" / "03-pii").mkdir(parents=True)
    (folder / "rejected" / "03-pii" / "part-000000.jsonl").write_text('{"text": "call 555-0100, card 4111..."}\n')
    write_meta(index_dir(str(folder), "exact_dedup"), "exact_dedup", 1, {"casefold": False, "hash": HASH_NAME}, {})
    files = ["manifest.json", "tokenizer.json", "stats.json", *(s.name for s in manifest.shards),
             "rejected/03-pii/part-000000.jsonl", "index/exact_dedup/meta.json"]
    (folder / ".tokenmill").mkdir(exist_ok=True)
    (folder / ".tokenmill" / "marker.json").write_text(json.dumps(
        {"tool": "tokenmill", "format": 1, "created": "2025-01-01T00:00:00+00:00", "files": files}))
    return manifest


def finished_job(db, folder: Path, *, state: JobState = JobState.SUCCEEDED, spec_hash: str = "synthetic",
                 summary: dict | None = None, category: str | None = None, message: str | None = None,
                 team: str = "default") -> str:
    """A job row of ``team`` for ``folder`` taken through its lifecycle to ``state``, as the supervisor would."""
    with db.session() as s:
        job, _ = repo.create_job(s, {"name": "synthetic", "folder": str(folder)}, name="synthetic",
                                 spec_hash=spec_hash, output_path=str(folder), team=team)
        if state != JobState.QUEUED:
            repo.transition(s, job, JobState.RUNNING)
        if state not in (JobState.QUEUED, JobState.RUNNING):
            repo.transition(s, job, state, category=category, message=message)
        if summary:
            job.summary = summary
        return job.id


@contextlib.contextmanager
def serve(app) -> Iterator[str]:
    """``app`` under uvicorn in a thread, on a free loopback port: real HTTP, the test's own process."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    end = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < end, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """``(url, app, token, root)``: the API (no supervisor) on a SQLite file, serving over HTTP."""
    tmp = tmp_path_factory.mktemp("artifacts")
    root = tmp / "data"
    root.mkdir()
    settings = Settings(state_dir=tmp / "state", database_url=f"sqlite:///{tmp / 'svc.db'}", input_roots=(root,),
                        output_roots=(root,), run_supervisor=False)
    app = create_app(settings)
    with serve(app) as url:
        with app.state.db.session() as s:
            _, token = repo.create_key(s, "trainer")
        yield url, app, token, root


@pytest.fixture(scope="module")
def job(service):
    """``(job id, output folder, manifest)`` of a SUCCEEDED job."""
    _, app, _, root = service
    out = root / "out" / "good"
    manifest = publish_output(out)
    return finished_job(app.state.db, out), out, manifest


def _client(url: str, token: str | None) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=30)


def _raw_get(url: str, path: str, token: str) -> int:
    """A GET whose path is sent exactly as written (httpx would remove ``..`` segments first)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_download_manifest_and_a_shard_over_http_and_check_sha256(service, job):
    url, _, token, _ = service
    job_id, out, manifest = job
    with _client(url, token) as c:
        listing = c.get(f"/v1/jobs/{job_id}/artifacts").json()["files"]
        names = {f["name"] for f in listing}
        assert names == {"manifest.json", "tokenizer.json", "stats.json", *(s.name for s in manifest.shards)}
        r = c.get(f"/v1/jobs/{job_id}/artifacts/manifest.json")
        assert r.status_code == 200 and r.headers["etag"] == f'"{hashlib.sha256(r.content).hexdigest()}"'
        served = Manifest.from_json(r.content)
        assert served == manifest
        shard = served.shards[1]
        r = c.get(f"/v1/jobs/{job_id}/artifacts/{shard.name}")
        assert r.status_code == 200 and len(r.content) == shard.bytes
        assert hashlib.sha256(r.content).hexdigest() == shard.sha256
        assert r.headers["etag"] == f'"{shard.sha256}"' and r.headers["accept-ranges"] == "bytes"
        assert r.headers["cache-control"] == "private, no-cache"
        assert {f["name"]: f["sha256"] for f in listing}[shard.name] == shard.sha256
    assert (out / shard.name).read_bytes() == r.content


def test_ranges_etags_and_conditional_requests(service, job):
    url, _, token, _ = service
    job_id, out, manifest = job
    shard = manifest.shards[0]
    path = f"/v1/jobs/{job_id}/artifacts/{shard.name}"
    data = (out / shard.name).read_bytes()
    etag = f'"{shard.sha256}"'
    with _client(url, token) as c:
        r = c.get(path, headers={"Range": "bytes=100-199"})
        assert r.status_code == 206 and r.content == data[100:200]
        assert r.headers["content-range"] == f"bytes 100-199/{len(data)}" and r.headers["etag"] == etag
        r = c.get(path, headers={"Range": "bytes=-10"})  # the last 10 bytes
        assert r.status_code == 206 and r.content == data[-10:]
        r = c.get(path, headers={"Range": "bytes=0-1,10-11"})
        assert r.status_code == 206 and r.headers["content-type"].startswith("multipart/byteranges")
        r = c.get(path, headers={"Range": f"bytes={len(data)}-"})
        assert r.status_code == 416 and r.headers["content-range"] == f"bytes */{len(data)}"
        r = c.get(path, headers={"If-None-Match": etag})
        assert r.status_code == 304 and r.content == b"" and r.headers["etag"] == etag
        assert c.get(path, headers={"If-None-Match": f'W/{etag}, "other"'}).status_code == 304
        assert c.get(path, headers={"If-None-Match": '"other"'}).status_code == 200
        r = c.get(path, headers={"Range": "bytes=0-9", "If-Range": etag})
        assert r.status_code == 206 and r.content == data[:10]
        r = c.get(path, headers={"Range": "bytes=0-9", "If-Range": '"stale"'})  # changed since: the whole file
        assert r.status_code == 200 and r.content == data
        r = c.head(path)
        assert r.status_code == 200 and r.content == b"" and int(r.headers["content-length"]) == len(data)


def test_unauthenticated_escaping_unpublished_and_cross_root_requests_are_refused(service, job, tmp_path):
    url, app, token, root = service
    job_id, out, manifest = job
    shard = manifest.shards[0].name
    db = app.state.db
    with _client(url, None) as anon, _client(url, "tm_000000000000_" + "x" * 43) as wrong:
        for c in (anon, wrong):
            for path in (f"/v1/jobs/{job_id}/artifacts", f"/v1/jobs/{job_id}/artifacts/manifest.json",
                         f"/v1/jobs/{job_id}/artifacts/{shard}"):
                r = c.get(path)
                assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", path
    base = f"/v1/jobs/{job_id}/artifacts"
    (root / "secret.txt").write_text("not an artifact")
    for path in (f"{base}/../../../../secret.txt", f"{base}/shards/../../secret.txt",
                 f"{base}/%2e%2e/%2e%2e/secret.txt", f"{base}/shards/%2e%2e/manifest.json",
                 f"{base}/%2Fetc%2Fpasswd", f"{base}//etc/passwd", f"{base}/.tokenmill/marker.json",
                 f"{base}/shards/shard-000000.tar%00", f"{base}/shards\\shard-000000.tar"):
        assert _raw_get(url, path, token) == 400, path  # sent as written: nothing normalizes it first
    with _client(url, token) as c:
        for name in ("rejected/03-pii/part-000000.jsonl", "index/exact_dedup/meta.json", "shards/unlisted.tar"):
            r = c.get(f"{base}/{name}")
            assert r.status_code == 404, (name, r.text)
        (out / "shards" / "unlisted.tar").write_bytes(b"x")  # on disk but not published: still 404
        assert c.get(f"{base}/shards/unlisted.tar").status_code == 404

        # a published name that is a symlink leading out of the output folder
        leaky = root / "out" / "leaky"
        m = publish_output(leaky, seed=1)
        target = leaky / m.shards[0].name
        target.unlink()
        target.symlink_to(root / "secret.txt")
        leaky_id = finished_job(db, leaky)
        r = c.get(f"/v1/jobs/{leaky_id}/artifacts/{m.shards[0].name}")
        assert r.status_code == 403 and "outside the output folder" in r.json()["detail"]

        # an output outside every configured root (written before a root was dropped, or a forged row)
        elsewhere = tmp_path / "elsewhere"
        publish_output(elsewhere, seed=2)
        r = c.get(f"/v1/jobs/{finished_job(db, elsewhere)}/artifacts/manifest.json")
        assert r.status_code == 403 and "outside the service's output roots" in r.json()["detail"]
        symlinked = root / "out" / "link-out"
        symlinked.symlink_to(elsewhere)
        r = c.get(f"/v1/jobs/{finished_job(db, symlinked)}/artifacts/manifest.json")
        assert r.status_code == 403

        running = finished_job(db, out, state=JobState.RUNNING)
        assert c.get(f"/v1/jobs/{running}/artifacts/manifest.json").status_code == 409
        replaced = finished_job(db, out, spec_hash="another-spec")
        assert c.get(f"/v1/jobs/{replaced}/artifacts/manifest.json").status_code == 410
        assert c.get("/v1/jobs/nope/artifacts/manifest.json").status_code == 404
        assert c.get(f"{base}/{shard}").status_code == 200  # and the good one still serves


def test_the_loader_streams_from_the_service_with_its_api_key(service, job, monkeypatch):
    url, _, token, _ = service
    job_id, out, _ = job
    base = f"{url}/v1/jobs/{job_id}/artifacts"

    def batches(loader: ShardLoader) -> list[list[str]]:
        return [b["keys"] for b in loader.epoch_batches()]

    local = batches(ShardLoader(str(out), 4, rank=1, world=2, num_workers=0))
    monkeypatch.delenv("TOKENMILL_API_KEY", raising=False)
    with pytest.raises(LoaderError, match="HTTP 401"):
        ShardLoader(base, 4, num_workers=0)
    assert batches(ShardLoader(base, 4, rank=1, world=2, num_workers=0, bearer_token=token)) == local
    monkeypatch.setenv("TOKENMILL_API_KEY", token)
    local2 = batches(ShardLoader(str(out), 4, rank=1, world=2, num_workers=2))
    assert batches(ShardLoader(base, 4, rank=1, world=2, num_workers=2)) == local2  # workers inherit the header
    with pytest.raises(LoaderError, match="HTTP 401"):  # an explicit Authorization header wins over the variable
        ShardLoader(base, 4, num_workers=0, headers={"Authorization": "Bearer wrong"})
    assert "Authorization" not in ShardSource(str(out)).headers  # never for a local folder


def test_latest_redirects_and_the_loader_pins_the_version_it_read(service):
    url, app, token, root = service
    db = app.state.db
    folder = root / "sched"
    with db.session() as s:
        sched = repo.create_schedule(s, name="s", cron="@daily", timezone="UTC", overlap="skip", paused=True,
                                     spec={}, output_path=str(folder), next_fire_at=None)
        sid = sched.id
    manifests = {}
    for n in (1, 2):
        manifests[n] = publish_output(folder / f"v00000{n}", seed=10 + n)
        job_id = finished_job(db, folder / f"v00000{n}")
        with db.session() as s:
            sched = repo.lock_schedule(s, sid)
            run = repo.add_run(s, sched, fire_at=utcnow(), state="succeeded", job_id=job_id, version=n)
            repo.add_version(s, run, path=str(folder / f"v00000{n}"), documents=None, samples=40, tokens=None,
                             shards=5)
    with _client(url, token) as c:
        r = c.get(f"/v1/schedules/{sid}/versions/latest/artifacts/manifest.json")
        assert r.status_code == 307 and r.headers["location"].endswith(f"/v1/schedules/{sid}/versions/2/artifacts/"
                                                                       "manifest.json")
        r = c.get(f"/v1/schedules/{sid}/versions/latest/artifacts")
        assert r.status_code == 307 and r.headers["location"].endswith("/versions/2/artifacts")
        r = c.get(f"/v1/schedules/{sid}/versions/1/artifacts/{manifests[1].shards[0].name}")
        assert r.status_code == 200 and hashlib.sha256(r.content).hexdigest() == manifests[1].shards[0].sha256
        assert r.headers["cache-control"] == "private, max-age=31536000, immutable"
        assert c.get(f"/v1/schedules/{sid}/versions/9/artifacts/manifest.json").status_code == 404
        assert c.get(f"/v1/schedules/{sid}/versions/0/artifacts/manifest.json").status_code == 422
        assert c.get(f"/v1/schedules/{sid}/versions/latest/artifacts/%2e%2e/x").status_code == 400
    source = ShardSource(f"{url}/v1/schedules/{sid}/versions/latest/artifacts", bearer_token=token)
    assert source.manifest() == manifests[2]
    assert source.location == f"{url}/v1/schedules/{sid}/versions/2/artifacts"  # pinned
    pinned = ShardLoader(f"{url}/v1/schedules/{sid}/versions/1/artifacts", 4, num_workers=0, bearer_token=token)
    assert pinned.manifest == manifests[1]
    assert len(list(pinned.epoch_batches())) == 10  # 40 samples / 4, all from version 1 (sha256-checked)


@pytest.mark.slow
def test_two_rank_torchrun_trains_streaming_from_the_service_with_an_api_key(service, job, tmp_path, monkeypatch):
    url, _, token, _ = service
    job_id, _, _ = job
    monkeypatch.setenv("TOKENMILL_API_KEY", token)
    run = tmp_path / "run"
    proc = torchrun(2, ["-m", "training.train", "--config", "training/configs/tiny.yaml",
                        "--data", f"{url}/v1/jobs/{job_id}/artifacts", "--out", str(run), "--max-steps", "3",
                        "--set", "data.num_workers=0"], timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["tokens_per_s"] > 0 for r in rows)


def test_documents_only_and_split_by_outputs_serve_their_own_layouts(service):
    url, app, token, root = service
    part = b'{"id": "a", "text": "hello"}\n'
    sha = hashlib.sha256(part).hexdigest()

    def documents_output(name: str, index: str) -> Path:
        """A documents-only output whose index is ``index`` (``documents.json``; ``documents/index.json`` before
        issue 22)."""
        docs = root / "out" / name
        (docs / "documents").mkdir(parents=True)
        (docs / "documents" / "part-000000.jsonl").write_bytes(part)
        (docs / index).write_text(json.dumps({"documents": "jsonl", "rows": 1, "parts": [
            {"name": "documents/part-000000.jsonl", "rows": 1, "bytes": len(part), "sha256": sha}]}))
        (docs / "stats.json").write_text("{}")
        (docs / ".tokenmill").mkdir()
        (docs / ".tokenmill" / "marker.json").write_text(json.dumps({"tool": "tokenmill", "format": 1, "created": "x",
            "files": ["stats.json", index, "documents/part-000000.jsonl"]}))
        return docs

    split = root / "out" / "split"
    de = publish_output(split / "de", seed=5)
    (split / "de" / ".tokenmill").rename(split / "de-marker")  # one marker, at the output's top
    files = ["de/manifest.json", "de/tokenizer.json", *(f"de/{s.name}" for s in de.shards)]
    (split / ".tokenmill").mkdir()
    (split / ".tokenmill" / "marker.json").write_text(json.dumps(
        {"tool": "tokenmill", "format": 1, "created": "x", "files": files}))
    with _client(url, token) as c:
        for name, index in (("docs-only", "documents.json"), ("docs-old", "documents/index.json")):
            docs_id = finished_job(app.state.db, documents_output(name, index))
            listing = {f["name"]: f["sha256"] for f in c.get(f"/v1/jobs/{docs_id}/artifacts").json()["files"]}
            assert set(listing) == {"stats.json", index, "documents/part-000000.jsonl"}
            r = c.get(f"/v1/jobs/{docs_id}/artifacts/documents/part-000000.jsonl")
            assert r.content == part and r.headers["etag"] == f'"{sha}"'
            assert c.get(f"/v1/jobs/{docs_id}/artifacts/{index}").status_code == 200
        split_id = finished_job(app.state.db, split)
        listing = {f["name"] for f in c.get(f"/v1/jobs/{split_id}/artifacts").json()["files"]}
        assert listing == set(files)
        r = c.get(f"/v1/jobs/{split_id}/artifacts/{files[2]}")
        assert r.status_code == 200 and r.headers["etag"] == f'"{de.shards[0].sha256}"'
        assert c.get(f"/v1/jobs/{split_id}/artifacts/de/rejected/03-pii/part-000000.jsonl").status_code == 404
    loader = ShardLoader(f"{url}/v1/jobs/{split_id}/artifacts/de", 4, num_workers=0, bearer_token=token)
    assert loader.manifest == de


def test_the_dataset_card_and_its_figures_are_served_and_an_svg_cannot_run_anything(service):
    url, app, token, root = service
    folder = root / "out" / "carded"
    publish_output(folder, seed=7)
    (folder / "README.md").write_text("---\npretty_name: x\n---\n# x\n")
    (folder / "card").mkdir()
    (folder / "card" / "funnel.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"/>')
    (folder / "card" / "funnel.png").write_bytes(b"\x89PNG\r\n")
    (folder / "card" / "spec.yaml").write_text("name: x\n")
    (folder / "card" / "notes.txt").write_text("not a card file")
    marker = json.loads((folder / ".tokenmill" / "marker.json").read_text())
    marker["files"] += ["README.md", "card/funnel.svg", "card/funnel.png", "card/spec.yaml", "card/notes.txt"]
    (folder / ".tokenmill" / "marker.json").write_text(json.dumps(marker))
    job_id = finished_job(app.state.db, folder)
    with _client(url, token) as c:
        listing = {f["name"] for f in c.get(f"/v1/jobs/{job_id}/artifacts").json()["files"]}
        assert {"README.md", "card/funnel.svg", "card/funnel.png", "card/spec.yaml"} <= listing
        assert "card/notes.txt" not in listing
        assert c.get(f"/v1/jobs/{job_id}/artifacts/README.md").text.startswith("---\npretty_name: x")
        svg = c.get(f"/v1/jobs/{job_id}/artifacts/card/funnel.svg")
        assert svg.status_code == 200 and "sandbox" in svg.headers["content-security-policy"]
        assert c.get(f"/v1/jobs/{job_id}/artifacts/card/notes.txt").status_code == 404


def test_the_app_runs_the_scheduler_beside_the_supervisor(tmp_path):
    settings = Settings(state_dir=tmp_path / "state", database_url=f"sqlite:///{tmp_path / 'svc.db'}",
                        input_roots=(tmp_path,), output_roots=(tmp_path,), poll_s=0.05)
    app = create_app(settings)
    with TestClient(app) as client:
        scheduler = app.state.scheduler
        end = time.monotonic() + 10
        while not (scheduler.leading and app.state.supervisor.leading) and time.monotonic() < end:  # the locks
            time.sleep(0.02)
        assert scheduler.running and scheduler.leading
        assert client.get("/readyz").json()["leader"] == {"supervisor": True, "scheduler": True}
    assert not scheduler.running and not scheduler.leading  # stopped with the app
    app = create_app(settings.model_copy(update={"run_supervisor": False}))
    with TestClient(app):
        assert app.state.scheduler is None
