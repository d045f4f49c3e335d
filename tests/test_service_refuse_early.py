"""The control plane's edges (issue 22), without Ray, on SQLite (FastAPI's TestClient, no supervisor).

- ``POST /v1/jobs`` checks the output folder as ``tokenmill run`` does, at once and read-only: 409 for a folder
  holding a published shard set (201 with ``output.overwrite``), for an unfinished job of another spec (the
  same spec resumes: 201) and for a folder tokenmill did not write; 422 for an output inside an input folder
  or containing an input; each naming ``output.path``, with no job row and nothing written. A job queued
  behind another on the same, still empty, folder is accepted (its manifest comes later); a repeated request
  (the same Idempotency-Key and spec) gets its job (200) whatever that job has published since.
- ``/docs`` and ``/redoc`` without ``--public-docs``: a JSON 404 saying how to enable them; with it, served.
- A deleted schedule's pinned version URLs keep serving its files (the store seeded directly); a schedule
  created again on the folder adopts the versions, and the old URLs still serve.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pipeline.job.state import WorkState
from pipeline.output.local_store import OutputDir
from pipeline.spec import JobSpec
from service.api.app import create_app
from service.settings import Settings
from service.store import repo
from service.store.models import Job, utcnow
from tests.test_service_artifacts import finished_job, publish_output


def _app(tmp_path: Path, **settings):
    root = Path(os.path.realpath(tmp_path)) / "data"
    (root / "in").mkdir(parents=True)
    (root / "in" / "a.jsonl").write_text('{"id": "a", "text": "hello"}\n')
    return create_app(Settings(state_dir=tmp_path / "state", database_url=f"sqlite:///{tmp_path / 'api.db'}",
                               input_roots=(root,), output_roots=(root,), run_supervisor=False, **settings)), root


@pytest.fixture
def api(tmp_path):
    """``(client, headers, data_root, app)``."""
    app, root = _app(tmp_path)
    with TestClient(app) as client:
        with app.state.db.session() as s:
            _, token = repo.create_key(s, "test")
        yield client, {"Authorization": f"Bearer {token}"}, root, app


def _spec(root: Path, out: Path, name: str = "job", inputs: str | None = None, **output) -> dict:
    return {"name": name, "inputs": [{"path": inputs or str(root / "in" / "*.jsonl")}],
            "output": {"path": str(out), **output}}


def _published(out: Path) -> None:
    """``out`` as an earlier job leaves it: claimed, then a manifest committed (the engine's own primitives)."""
    store = OutputDir(out)
    with store.lock():
        store.claim(False)
        os.makedirs(store.stage)
        Path(store.stage, "manifest.json").write_text('{"shards": []}')
        store.commit()


def _jobs(app) -> int:
    with app.state.db.read() as s:
        return len(s.query(Job).all())


def _refused(r, status: int, kind: str, field: str = "path") -> str:
    """The one problem of a refusal: at ``body.output.<field>``, of type ``kind``; its message."""
    assert r.status_code == status, r.text
    [problem] = r.json()["detail"]
    assert problem["loc"] == ["body", "output", field] and problem["type"] == kind, problem
    return problem["msg"]


def test_an_output_holding_a_shard_set_is_refused_at_once_and_overwrite_is_accepted(api):
    client, headers, root, app = api
    out = root / "shards"
    _published(out)
    before = sorted(p.name for p in (out / ".tokenmill").iterdir())
    t0 = time.perf_counter()
    r = client.post("/v1/jobs", json=_spec(root, out), headers=headers)
    seconds = time.perf_counter() - t0
    assert "already holds a shard set" in _refused(r, 409, "output_exists")
    assert "output.overwrite" in r.json()["detail"][0]["msg"]
    assert seconds < 1.0, seconds  # answered by admission, not after a job ran
    assert _jobs(app) == 0
    assert sorted(p.name for p in (out / ".tokenmill").iterdir()) == before  # read-only: no lock file left, no work
    r = client.post("/v1/jobs", json=_spec(root, out, overwrite=True), headers=headers)
    assert r.status_code == 201, r.text
    assert _jobs(app) == 1


def test_an_unfinished_job_of_another_spec_is_refused_the_same_spec_resumes(api):
    client, headers, root, app = api
    out = root / "shards"
    spec = _spec(root, out, name="first")
    store = OutputDir(out)
    with store.lock():
        store.claim(False)
    os.makedirs(store.work)
    WorkState(store.work, JobSpec.model_validate(spec).content_hash()).save()  # "first" stopped half-way
    msg = _refused(client.post("/v1/jobs", json=_spec(root, out, name="second"), headers=headers), 409,
                   "output_unfinished_job")
    assert "unfinished job of another spec" in msg
    assert client.post("/v1/jobs", json=spec, headers=headers).status_code == 201  # its own spec continues it
    assert client.post("/v1/jobs", json=_spec(root, out, name="second", overwrite=True),
                       headers=headers).status_code == 201  # overwrite: the engine starts over


def test_a_folder_tokenmill_did_not_write_is_refused_and_left_untouched(api):
    client, headers, root, app = api
    out = root / "photos"
    out.mkdir()
    (out / "me.jpg").write_bytes(b"\xff\xd8")
    for overwrite in (False, True):  # overwrite never takes a foreign folder
        msg = _refused(client.post("/v1/jobs", json=_spec(root, out, overwrite=overwrite), headers=headers), 409,
                       "output_not_usable")
        assert "not written by tokenmill" in msg
    assert sorted(os.listdir(out)) == ["me.jpg"] and _jobs(app) == 0


def test_an_output_overlapping_an_input_is_a_422(api):
    client, headers, root, app = api
    inside = _spec(root, root / "in" / "out")  # inside the folder the input glob reads
    assert "lies inside inputs.0.path" in _refused(client.post("/v1/jobs", json=inside, headers=headers), 422,
                                                   "output_overlaps_input")
    (root / "corpus" / "raw").mkdir(parents=True)
    (root / "corpus" / "raw" / "b.jsonl").write_text('{"id": "b", "text": "hi"}\n')
    around = _spec(root, root / "corpus", inputs=str(root / "corpus" / "raw" / "b.jsonl"))  # contains the input
    assert "contains inputs.0.path" in _refused(client.post("/v1/jobs", json=around, headers=headers), 422,
                                                "output_overlaps_input")
    assert _jobs(app) == 0 and not (root / "in" / "out").exists()


def test_a_job_queued_behind_another_on_the_same_folder_is_accepted(api):
    client, headers, root, app = api
    out = root / "shards"
    assert client.post("/v1/jobs", json=_spec(root, out, name="a"), headers=headers).status_code == 201
    # nothing is on disk yet: the first job's manifest will only be written when it runs
    assert client.post("/v1/jobs", json=_spec(root, out, name="b"), headers=headers).status_code == 201
    assert not out.exists()  # admission created nothing


def test_a_repeated_request_gets_its_job_after_the_job_published(api):
    client, headers, root, app = api
    out = root / "shards"
    first = client.post("/v1/jobs", json=_spec(root, out), headers={**headers, "Idempotency-Key": "k"})
    assert first.status_code == 201, first.text
    _published(out)  # what the job's run leaves
    again = client.post("/v1/jobs", json=_spec(root, out), headers={**headers, "Idempotency-Key": "k"})
    assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])
    _refused(client.post("/v1/jobs", json=_spec(root, out), headers={**headers, "Idempotency-Key": "new"}), 409,
             "output_exists")
    assert _jobs(app) == 1


def test_the_schema_documents_the_submission_statuses(api):
    client, headers, _, _ = api
    responses = client.get("/openapi.json", headers=headers).json()["paths"]["/v1/jobs"]["post"]["responses"]
    refs = [o["$ref"] for o in responses["409"]["content"]["application/json"]["schema"]["anyOf"]]
    assert refs == ["#/components/schemas/Message", "#/components/schemas/ProblemList"]
    assert responses["422"]["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/ProblemList"


# ---- /docs ---------------------------------------------------------------------------------------------------


def test_docs_pages_say_how_to_enable_them_and_are_served_with_public_docs(tmp_path):
    app, _ = _app(tmp_path / "private")
    with TestClient(app) as client:
        for page in ("/docs", "/redoc"):
            r = client.get(page)  # no key: a browser opening the page sends none
            assert r.status_code == 404 and r.headers["content-type"] == "application/json"
            assert "--public-docs" in r.json()["detail"] and "/openapi.json" in r.json()["detail"]
        assert client.get("/openapi.json").status_code == 401
    app, _ = _app(tmp_path / "public", public_docs=True)
    with TestClient(app) as client:
        r = client.get("/docs")
        assert r.status_code == 200 and "swagger-ui" in r.text
        assert client.get("/openapi.json").status_code == 200  # what the page loads, keyless


# ---- versions after delete -------------------------------------------------------------------------------------


def test_a_deleted_schedules_versions_stay_served_and_a_new_schedule_adopts_them(api):
    client, headers, root, app = api
    db, folder = app.state.db, root / "sched"
    with db.session() as s:
        sid = repo.create_schedule(s, name="s", cron="@daily", timezone="UTC", overlap="skip", paused=True,
                                   spec={}, output_path=str(folder), next_fire_at=None).id
    manifests = {}
    for n in (1, 2):
        manifests[n] = publish_output(folder / f"v00000{n}", seed=20 + n)
        job_id = finished_job(db, folder / f"v00000{n}")
        with db.session() as s:
            run = repo.add_run(s, repo.lock_schedule(s, sid), fire_at=utcnow(), state="succeeded", job_id=job_id,
                               version=n)
            repo.add_version(s, run, path=str(folder / f"v00000{n}"), documents=None, samples=40, tokens=None,
                             shards=5)
    shard = manifests[1].shards[0]
    pinned = f"/v1/schedules/{sid}/versions/1/artifacts"
    assert client.delete(f"/v1/schedules/{sid}", headers=headers).status_code == 204

    r = client.get(f"{pinned}/{shard.name}", headers=headers)
    assert r.status_code == 200 and hashlib.sha256(r.content).hexdigest() == shard.sha256
    assert {f["name"] for f in client.get(pinned, headers=headers).json()["files"]} >= {"manifest.json", shard.name}
    r = client.get(f"/v1/schedules/{sid}/versions/latest/artifacts", headers=headers, follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"].endswith(f"/v1/schedules/{sid}/versions/2/artifacts")
    listed = client.get(f"/v1/schedules/{sid}/versions", headers=headers).json()
    assert [v["number"] for v in listed["items"]] == [1, 2] and listed["latest"] == 2
    r = client.get(f"/v1/schedules/{sid}", headers=headers)  # the schedule itself is gone, and says where to look
    assert r.status_code == 404 and f"/v1/schedules/{sid}/versions" in r.json()["detail"]
    assert client.get(f"/v1/schedules/{sid}/runs", headers=headers).status_code == 404
    assert client.get(f"/v1/schedules/{sid}/versions/3/artifacts", headers=headers).status_code == 404
    r = client.get("/v1/schedules/0123456789abcdef/versions/1/artifacts", headers=headers)
    assert r.status_code == 404 and "no schedule" in r.json()["detail"]  # control: an id no schedule had

    spec = {"name": "again", "inputs": [{"path": str(root / "in" / "*.jsonl")}], "stages": [{"type": "exact_dedup"}],
            "output": {"path": str(folder)}}
    r = client.post("/v1/schedules", json={"cron": "0 3 * * *", "spec": spec}, headers=headers)
    assert r.status_code == 201, r.text
    new = r.json()["id"]
    assert new != sid and r.json()["latest_version"] == 2  # adopted
    r = client.get(f"/v1/schedules/{new}/versions/1/artifacts/{shard.name}", headers=headers)
    assert r.status_code == 200 and hashlib.sha256(r.content).hexdigest() == shard.sha256
    assert client.get(f"{pinned}/{shard.name}", headers=headers).status_code == 200  # the old URL still serves


# ---- one round ---------------------------------------------------------------------------------------------


def test_a_submission_gets_schema_params_and_file_problems_in_one_round(api):
    """An unknown stage, a bad stage parameter and an input that matches nothing: one 422 naming all three.
    A path outside the roots gets no file check (its existence is not the service's to tell)."""
    client, headers, root, app = api
    spec = _spec(root, root / "out", inputs=str(root / "in" / "nothing-*.jsonl"))
    spec["inputs"].append({"path": "/etc/nothing-*.conf"})
    spec["stages"] = [{"type": "no_such_stage"}, {"type": "near_dedup", "params": {"threshold": 7}}]
    r = client.post("/v1/jobs", json=spec, headers=headers)
    assert r.status_code == 422, r.text
    by_loc = {tuple(p["loc"]): p for p in r.json()["detail"]}
    assert by_loc[("body", "stages", 0, "type")]["type"] == "unknown_stage"
    assert ("body", "stages", 1, "params", "threshold") in by_loc
    assert by_loc[("body", "inputs", 0, "path")]["type"] == "no_match"
    assert ("body", "inputs", 1, "path") not in by_loc
    assert _jobs(app) == 0
    r = client.post("/v1/jobs", json=spec)  # no key: refused before anything is looked at
    assert r.status_code == 401
    tok = str(root / "in" / "no-tokenizer.json")
    spec["tokenizer"] = {"path": tok}
    sched = client.post("/v1/schedules", json={"cron": "@daily", "spec": spec}, headers=headers)
    assert sched.status_code == 422
    locs = {tuple(p["loc"]) for p in sched.json()["detail"]}
    assert ("body", "spec", "tokenizer", "path") in locs  # a file check, in the same round as the schema's
    assert ("body", "spec", "inputs", 0, "path") not in locs  # a schedule's inputs may match nothing yet


# ---- YAML bodies -------------------------------------------------------------------------------------------


def test_a_spec_sent_in_yaml_is_read_as_its_json_and_its_errors_have_a_line(api):
    client, headers, root, app = api
    yaml_headers = {**headers, "Content-Type": "application/yaml"}
    text = (f"name: from-yaml\ninputs:\n  - path: {root / 'in' / '*.jsonl'}  # a comment\n"
            f"output:\n  path: {root / 'y'}\n")
    r = client.post("/v1/jobs", content=text, headers=yaml_headers)
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "from-yaml" and _jobs(app) == 1
    r = client.post("/v1/jobs", content="name: x\ninputs: [\n  - path: a\n", headers=yaml_headers)
    [problem] = r.json()["detail"]
    assert r.status_code == 422 and problem["loc"] == ["body"] and problem["type"] == "yaml_invalid"
    assert problem["msg"].startswith("line 3, column "), problem
    bomb = "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"  # aliases: refused, never expanded
    r = client.post("/v1/jobs", content=bomb, headers={**headers, "Content-Type": "text/yaml; charset=utf-8"})
    assert r.status_code == 422 and "aliases" in r.json()["detail"][0]["msg"]
    r = client.post("/v1/jobs", content=f"name: bad\ninputs: [{{path: {root / 'in' / '*.jsonl'}}}]\n",
                    headers=yaml_headers)  # schema problems as for JSON
    assert r.status_code == 422 and ["body", "output"] in [p["loc"] for p in r.json()["detail"]]
    assert client.post("/v1/jobs", content="name: x\n", headers={"Content-Type": "application/yaml"}).status_code == 401
    body = client.get("/openapi.json", headers=headers).json()["paths"]["/v1/jobs"]["post"]["requestBody"]
    assert set(body["content"]) == {"application/json", "application/yaml"}
    assert _jobs(app) == 1
