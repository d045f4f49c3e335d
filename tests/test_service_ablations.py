"""``/v1/ablations`` (issue 40): ``tokenmill ablate`` from the control plane, as a job of kind ``ablation``.

- The API's checks (SQLite and PostgreSQL, no supervisor, well under a second each): a bad field is a 422 at
  the field, a path outside the roots a 403 at the field, a reader may not submit, another team's ablation is an
  unknown id, a queued one cancels, and ablations are not in the jobs list.
- End to end: the tiny ablation of tests/test_ablate.py (2 variants x 1 seed, a few steps) submitted over real
  HTTP to the app with its supervisor, which runs it as a job process (its own local Ray, the trainer and
  ``tokenmill eval`` as subprocesses); it reaches SUCCEEDED and ``GET`` shows every step done and the scores.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from service.api.app import create_app
from service.settings import Settings
from service.store import repo
from tests.test_ablate import _ablation, _raw
from tests.test_service_api import api  # noqa: F401 - a fixture
from tests.test_service_artifacts import serve
from tests.test_service_store import postgres_url  # noqa: F401 - a fixture
from tests.test_service_teams import _spec as job_spec
from tests.test_service_teams import teams  # noqa: F401 - a fixture


def _spec(root: Path, **extra) -> dict:
    (root / "ab").mkdir(exist_ok=True)
    if not (root / "ab" / "raw.jsonl").exists():
        _raw(root / "ab" / "raw.jsonl")
    return _ablation(root / "ab", **extra)


@pytest.mark.parametrize(("change", "status", "loc"), [
    ({"seeds": [0, 0]}, 422, ["body", "seeds"]),
    ({"budgett": {"tokens": 1}}, 422, ["body", "budgett"]),
    ({"variants": {"x": {"stages": [{"type": "length", "params": {"min_chars": -1}}]}}}, 422,
     ["body", "variants", "x", "stages", 0, "params", "min_chars"]),
    ({"raw": {"path": "/etc/passwd", "format": "jsonl"}}, 403, ["body", "raw", "path"]),
    ({"out": "/tmp/elsewhere"}, 403, ["body", "out"]),
])
def test_a_bad_ablation_is_refused_at_its_field(teams, change, status, loc):  # noqa: F811
    client, keys, root = teams
    r = client.post("/v1/ablations", json=_spec(root, **change), headers=keys["a"])
    assert r.status_code == status, r.text
    assert any(d["loc"][:len(loc)] == loc for d in r.json()["detail"]), r.json()


def test_roles_teams_cancel_and_the_jobs_list(teams):  # noqa: F811
    client, keys, root = teams
    refused = client.post("/v1/ablations", json=_spec(root), headers=keys["reader"])
    assert refused.status_code == 403 and "role reader may not submit ablations" in refused.text
    made = client.post("/v1/ablations", json=_spec(root), headers=keys["a"])
    assert made.status_code == 201, made.text
    ab = made.json()
    assert (ab["state"], ab["team"], ab["steps_done"], ab["scores"]) == ("QUEUED", "a", [], None)
    unknown = "0" * 16
    for method, path in (("GET", "/v1/ablations/{}"), ("POST", "/v1/ablations/{}/cancel")):
        theirs = client.request(method, path.format(ab["id"]), headers=keys["b"])
        none = client.request(method, path.format(unknown), headers=keys["b"])
        assert theirs.status_code == none.status_code == 404, (method, theirs.text)
        assert theirs.json() == {"detail": none.json()["detail"].replace(unknown, ab["id"])}
    assert client.get("/v1/ablations", headers=keys["b"]).json()["items"] == []
    assert [a["id"] for a in client.get("/v1/ablations", headers=keys["a"]).json()["items"]] == [ab["id"]]
    assert client.get("/v1/jobs", headers=keys["a"]).json()["items"] == []  # an ablation is listed apart
    job = client.post("/v1/jobs", json=job_spec(root, "a-job", "job-out"), headers=keys["a"]).json()
    assert client.get(f"/v1/ablations/{job['id']}", headers=keys["a"]).status_code == 404  # a job is no ablation
    cancelled = client.post(f"/v1/ablations/{ab['id']}/cancel", headers=keys["a"])
    assert cancelled.status_code == 202 and cancelled.json()["state"] == "CANCELLED", cancelled.text


def test_a_raw_input_that_matches_nothing_is_refused_and_a_repeat_gets_its_ablation(teams):  # noqa: F811
    client, keys, root = teams
    spec = _spec(root)
    nothing = {**spec["raw"], "path": str(root / "ab" / "no-*.jsonl")}
    missing = client.post("/v1/ablations", json={**spec, "raw": nothing}, headers=keys["a"])
    assert missing.status_code == 422, missing.text
    assert [(d["loc"], d["type"]) for d in missing.json()["detail"]] == [(["body", "raw", "path"], "no_match")]
    once = {**keys["a"], "Idempotency-Key": "ablation-1"}
    first = client.post("/v1/ablations", json=spec, headers=once)
    again = client.post("/v1/ablations", json=spec, headers=once)
    assert (first.status_code, again.status_code) == (201, 200), again.text
    assert again.json()["id"] == first.json()["id"] and again.headers["Location"] == first.headers["Location"]
    other = client.post("/v1/ablations", json={**spec, "seeds": [7]}, headers=once)
    assert other.status_code == 409 and "Idempotency-Key" in other.text
    assert len(client.get("/v1/ablations", headers=keys["a"]).json()["items"]) == 1
    client.post(f"/v1/ablations/{first.json()['id']}/cancel", headers=keys["a"])


@pytest.mark.ray
@pytest.mark.slow
def test_an_ablation_submitted_over_http_runs_to_its_result(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    settings = Settings(state_dir=tmp_path / "state", database_url=f"sqlite:///{tmp_path / 'svc.db'}",
                        input_roots=(root,), output_roots=(root,), job_cpus=1, poll_s=0.2)
    app = create_app(settings)
    with serve(app) as url:
        with app.state.db.session() as s:
            _, token = repo.create_key(s, "e2e")
        client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        r = client.post("/v1/ablations", json=_spec(root))
        assert r.status_code == 201, r.text
        ab_id = r.json()["id"]
        end = time.monotonic() + 300
        while (ab := client.get(f"/v1/ablations/{ab_id}").json())["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            assert time.monotonic() < end, ab
            time.sleep(0.5)
        log = client.get(f"/v1/jobs/{ab_id}/logs").text
        assert ab["state"] == "SUCCEEDED", (ab, log)
        assert {"split", "tokenizer", "job:plain", "eval:plain:0", "job:long", "eval:long:0"} <= set(ab["steps_done"])
        for name in ("plain", "long"):
            common = ab["scores"][name]["common"]
            assert common["mean"] > 0 and common["n"] == 1 and common["spread"] == 0
        assert "common" in ab["gaps"]["plain-long"]
        assert "common bpb" in log  # the job's log is the ablation's output
        client.close()
