"""``/v1/mixtures`` over real HTTP (the app under uvicorn on 127.0.0.1, no Ray): creation validated and
idempotent, ``latest`` pinned at creation (a mixture made on v1 keeps reading v1 after v2 is published), refusals
naming the field (4xx, never 500), the mixture file served like an artifact, ``tokenmill mix --server``, and a
2-rank CPU ``torchrun`` of the tiny config streaming a mixture from the service, logging tokens per source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline.shard_format import Manifest
from service.commands import mix
from service.store import repo
from service.store.models import utcnow
from tests.test_loader_dist import torchrun
from tests.test_service_artifacts import (
    _client,
    finished_job,
    publish_output,
    service,  # noqa: F401 - a fixture
)
from training.data import LoaderError
from training.mixture_data import MixtureLoader


@pytest.fixture(scope="module")
def mixed(request):
    """``(url, app, token, root, ids)``: the artifacts tests' service with two finished jobs, one made with
    another tokenizer, and a schedule with version 1."""
    url, app, token, root = request.getfixturevalue("service")
    root = root / "mixtures"
    db = app.state.db
    ids = {}
    for name, seed, n in (("web", 1, 64), ("code", 2, 24)):
        publish_output(root / name, n=n, seed=seed)
        ids[name] = finished_job(db, root / name)
    odd = root / "odd"
    publish_output(odd, n=16, seed=3)
    manifest = Manifest.load(odd)
    manifest.tokenizer_hash = "another-tokenizer"
    (odd / "manifest.json").write_text(manifest.to_json())
    ids["odd"] = finished_job(db, odd)
    with db.session() as s:
        ids["schedule"] = repo.create_schedule(s, name="books", cron="@daily", timezone="UTC", overlap="skip",
                                               paused=True, spec={}, output_path=str(root / "books"),
                                               next_fire_at=None).id
    publish_version(app, root, ids["schedule"], 1)
    return url, app, token, root, ids


def publish_version(app, root: Path, schedule_id: str, n: int) -> None:
    folder = root / "books" / f"v{n:06d}"
    publish_output(folder, n=16, seed=20 + n)
    job_id = finished_job(app.state.db, folder)
    with app.state.db.session() as s:
        sched = repo.lock_schedule(s, schedule_id)
        run = repo.add_run(s, sched, fire_at=utcnow(), state="succeeded", job_id=job_id, version=n)
        repo.add_version(s, run, path=str(folder), documents=None, samples=16, tokens=None, shards=2)


def spec(ids: dict[str, str], **extra) -> dict:
    return {"name": "blend", "seed": 1, "sources": [
        {"name": "web", "job": ids["web"], "weight": 0.7},
        {"name": "code", "job": ids["code"], "weight": 0.2},
        {"name": "books", "schedule": ids["schedule"], "version": "latest", "weight": 0.1, "max_epochs": 4}],
        **extra}


@pytest.fixture(scope="module")
def made(mixed) -> dict:
    url, _, token, _, ids = mixed
    with _client(url, token) as c:
        r = c.post("/v1/mixtures", json=spec(ids))
    assert r.status_code == 201, r.text
    return r.json()


def test_created_pinned_and_idempotent(mixed, made):
    url, app, token, root, ids = mixed
    books = made["sources"][2]
    assert books["pinned"] == {"schedule": ids["schedule"], "version": 1}
    assert books["location"] == f"/v1/schedules/{ids['schedule']}/versions/1/artifacts"
    assert made["sources"][0]["pinned"] == {"job": ids["web"]}
    assert [s["target_share"] for s in made["sources"]] == pytest.approx([0.7, 0.2, 0.1])
    with _client(url, token) as c:
        again = c.post("/v1/mixtures", json=spec(ids))
        assert again.status_code == 200 and again.json()["id"] == made["id"]  # same spec, same pins: same mixture
        assert c.get(f"/v1/mixtures/{made['id']}").json() == made
        assert made["id"] in [m["id"] for m in c.get("/v1/mixtures").json()["items"]]
        listing = c.get(f"/v1/mixtures/{made['id']}/artifacts").json()["files"]
        body = c.get(made["data"])
        assert body.status_code == 200 and listing == [{"name": "mixture.json", "bytes": len(body.content),
                                                         "sha256": made["sha256"]}]
        assert c.get(made["data"], headers={"If-None-Match": f'"{made["sha256"]}"'}).status_code == 304
        assert c.get(f"/v1/mixtures/{made['id']}/artifacts/manifest.json").status_code == 404


def test_a_version_pinned_mixture_keeps_reading_v1_after_v2_is_published(mixed, made):
    url, app, token, root, ids = mixed
    data = f"{url}{made['data']}"
    before = [b["keys"] for b in MixtureLoader(data, 4, num_workers=0, bearer_token=token).epoch_batches()]
    publish_version(app, root, ids["schedule"], 2)
    with _client(url, token) as c:
        newer = c.post("/v1/mixtures", json=spec(ids))
    assert newer.status_code == 201 and newer.json()["sources"][2]["pinned"]["version"] == 2
    loader = MixtureLoader(data, 4, num_workers=0, bearer_token=token)
    assert loader.sources[2].location.endswith("/versions/1/artifacts")
    assert [b["keys"] for b in loader.epoch_batches()] == before  # v1's samples, sha256-checked
    with pytest.raises(LoaderError, match="HTTP 401"):
        MixtureLoader(data, 4, num_workers=0, bearer_token="wrong")


@pytest.mark.parametrize("change, status, field, message", [
    (lambda s, ids: s["sources"][0].update(job=None, path="/etc"), 422, "sources.0.path", "the control plane blends"),
    # a source that does not exist: what its own URL answers (issue 37)
    (lambda s, ids: s["sources"][1].update(job="0123456789abcdef"), 404, "sources.1.job", "no job"),
    (lambda s, ids: s["sources"][1].update(job=ids["odd"]), 422, "sources.1",
     "code and web differ in tokenizer_hash"),
    (lambda s, ids: s["sources"][2].update(version=9), 404, "sources.2.schedule", "has no version 9"),
    (lambda s, ids: s["sources"][0].update(weight=-1), 422, "sources.0.weight", "greater than 0"),
    (lambda s, ids: s.update(total_tokens=10**6), 422, "sources.2.max_epochs", "more than max_epochs 4"),
])
def test_refusals_are_4xx_naming_the_field(mixed, change, status, field, message):
    url, _, token, _, ids = mixed
    body = spec(ids)
    change(body, ids)
    with _client(url, token) as c:
        r = c.post("/v1/mixtures", json=body)
    assert r.status_code == status, r.text
    found = [(".".join(str(x) for x in p["loc"][1:]), p["msg"]) for p in r.json()["detail"]]
    assert any(f == field and message in m for f, m in found), found


def test_unknown_and_malformed_ids_and_no_key(mixed):
    url, _, token, _, ids = mixed
    with _client(url, token) as c:
        assert c.get("/v1/mixtures/0123456789abcdef").status_code == 404
        assert c.get("/v1/mixtures/not-an-id").status_code == 422
    with _client(url, None) as c:
        assert c.post("/v1/mixtures", json=spec(ids)).status_code == 401


def test_mix_with_server_makes_it_remotely(mixed, tmp_path, capsys):
    url, _, token, _, ids = mixed
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(spec(ids)))
    assert mix.main([str(path), "--server", url, "--api-key", token]) == 0
    out = capsys.readouterr().out
    with _client(url, token) as c:
        same = c.post("/v1/mixtures", json=spec(ids))
    assert same.status_code == 200  # the CLI made it: the same spec again is the same mixture
    assert f"mixture {same.json()['id']}: --data {url}{same.json()['data']}" in out and "schedule=" in out
    path.write_text(yaml.safe_dump({"sources": [{"name": "a", "job": "0123456789abcdef", "weight": 1}]}))
    assert mix.main([str(path), "--server", url, "--api-key", token]) == 2
    assert "HTTP 404: sources.0.job: a: no job" in capsys.readouterr().err


@pytest.mark.slow
def test_torchrun_trains_on_a_mixture_served_by_the_control_plane(mixed, made, tmp_path, monkeypatch):
    url, _, token, _, _ = mixed
    monkeypatch.setenv("TOKENMILL_API_KEY", token)
    run = tmp_path / "run"
    proc = torchrun(2, ["-m", "training.train", "--config", "training/configs/tiny.yaml",
                        "--data", f"{url}{made['data']}", "--out", str(run), "--max-steps", "4",
                        "--set", "data.num_workers=0"], timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    names = [s["name"] for s in made["sources"]]
    assert all(r2[f"source_tokens.{n}"] >= r1[f"source_tokens.{n}"]
               for r1, r2 in zip(rows, rows[1:], strict=False) for n in names)
    # exactly what the two ranks' loaders hand out in 4 steps (the trainer's data settings), per source
    want = [0] * len(names)
    for rank in range(2):
        loader = MixtureLoader(f"{url}{made['data']}", 4, rank=rank, world=2, num_workers=0, shuffle_window=256)
        for _, batch in zip(range(4), loader, strict=False):
            want = [w + t for w, t in zip(want, batch["source_tokens"], strict=True)]
    assert [rows[-1][f"source_tokens.{n}"] for n in names] == want and all(want[:2])
