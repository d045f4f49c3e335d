"""The OpenAPI schema states the rules a request body must follow across its fields (issue 37), and the server
still refuses a body that breaks one, naming the field.

- **In the schema** (checked with a JSON Schema 2020-12 validator against the app's own ``/openapi.json``):
  ``tokenizer: null`` needs ``output.documents``; a schedule's spec (created or updated) needs an
  ``exact_dedup`` or ``near_dedup`` stage; a stage's ``type`` is a known one; no string holds U+0000; this
  server's ``--max-job-cpus`` and Ray address; a mixture source is exactly one of ``job`` / ``schedule`` (a
  ``path`` the service never reads), one of ``weight`` / ``tokens``, ``version`` only with ``schedule``.
- **Still refused** (on SQLite and PostgreSQL): each of those a 422 naming the field; an update's spec naming
  another folder than its schedule's is a 409 naming ``spec.output.path`` (the schedule's state, which no schema
  of the body can hold), one with U+0000 in that path a 422, not a 500; a mixture source that does not exist a
  404 naming it (as its own URL answers), two sources of one name a 422 naming the second.

tests/test_api_fuzz.py runs schemathesis against the same schema, live.
"""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from service.api.app import create_app
from service.settings import Settings
from tests.test_service_api import _spec, api  # noqa: F401 - a fixture
from tests.test_service_store import postgres_url  # noqa: F401 - a fixture


@pytest.fixture(scope="module")
def openapi(tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("schema")
    app = create_app(Settings(state_dir=tmp / "state", database_url=f"sqlite:///{tmp / 'db'}", run_supervisor=False,
                              input_roots=(tmp,), output_roots=(tmp,), max_job_cpus=2))
    return app.openapi()


def _body_ok(openapi: dict[str, Any], method: str, path: str, body: Any) -> bool:
    """Whether ``body`` is valid for the operation's request body, by the schema alone."""
    schema = openapi["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return Draft202012Validator({**schema, "components": openapi["components"]}).is_valid(body)


JOB = {"name": "j", "inputs": [{"path": "/d/in/*.jsonl"}], "output": {"path": "/d/out"}}
DEDUP = [{"type": "exact_dedup"}]


def _with(body: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**body, **changes}


def test_the_schema_states_the_job_spec_rules(openapi):
    ok = lambda body: _body_ok(openapi, "post", "/v1/jobs", body)  # noqa: E731
    assert ok(JOB) and ok(_with(JOB, tokenizer={"path": "/d/t.json"}))
    assert not ok(_with(JOB, tokenizer=None))  # documents_required
    assert not ok(_with(JOB, tokenizer=None, output={"path": "/d/out", "documents": None}))
    assert ok(_with(JOB, tokenizer=None, output={"path": "/d/out", "documents": "parquet"}))
    assert ok(_with(JOB, stages=DEDUP)) and not ok(_with(JOB, stages=[{"type": "no_such_stage"}]))
    assert not ok(_with(JOB, inputs=[{"path": "/d/in", "text_field": "te\x00xt"}]))  # U+0000
    assert ok(_with(JOB, execution={"num_cpus": 2, "parallelism": 2}))
    assert not ok(_with(JOB, execution={"num_cpus": 3})) and not ok(_with(JOB, execution={"parallelism": 3}))
    assert ok(_with(JOB, execution={"address": None})) and not ok(_with(JOB, execution={"address": "ray://x:1"}))


def test_the_schema_states_that_a_schedule_needs_a_dedup_stage(openapi):
    create = {"cron": "@daily", "spec": JOB}
    assert not _body_ok(openapi, "post", "/v1/schedules", create)  # dedup_required
    assert _body_ok(openapi, "post", "/v1/schedules", _with(create, spec=_with(JOB, stages=DEDUP)))
    assert not _body_ok(openapi, "post", "/v1/schedules",
                        _with(create, spec=_with(JOB, stages=[{"type": "length"}])))
    update = "/v1/schedules/{schedule_id}"
    assert not _body_ok(openapi, "patch", update, {"spec": JOB})
    assert _body_ok(openapi, "patch", update, {"spec": _with(JOB, stages=DEDUP)})
    assert _body_ok(openapi, "patch", update, {"name": "n"}) and _body_ok(openapi, "patch", update, {"spec": None})


@pytest.mark.parametrize("source, valid", [
    ({"job": "0123456789abcdef", "weight": 1}, True),
    ({"schedule": "0123456789abcdef", "version": 2, "tokens": 10}, True),
    ({"weight": 1}, False),  # none of job / schedule
    ({"job": "a", "schedule": "b", "weight": 1}, False),  # two
    ({"job": "a", "schedule": None, "weight": 1}, True),  # null is not given
    ({"path": "/d/shards", "weight": 1}, False),  # the service blends its own outputs only
    ({"job": "a"}, False), ({"job": "a", "weight": 1, "tokens": 5}, False),  # one of weight / tokens
    ({"job": "a", "version": 1, "weight": 1}, False),  # version: only with schedule
    ({"schedule": "a", "version": 0, "weight": 1}, False),
])
def test_the_schema_states_the_mixture_source_rules(openapi, source, valid):
    assert _body_ok(openapi, "post", "/v1/mixtures", {"sources": [{"name": "s", **source}]}) is valid


def _refused(r, status: int, *loc: str | int, kind: str | None = None) -> None:
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    if isinstance(detail, str):  # a 409's message names its field first
        assert detail.startswith(".".join(map(str, loc)) + ": "), detail
        return
    assert [p["loc"] for p in detail] == [["body", *loc]], detail
    assert kind is None or detail[0]["type"] == kind, detail


def test_bodies_that_break_a_rule_are_refused_naming_the_field(api):  # noqa: F811 - the imported fixture
    client, headers, root = api
    spec = _spec(root, stages=DEDUP)
    _refused(client.post("/v1/jobs", json=_spec(root, tokenizer=None), headers=headers), 422, "tokenizer",
             kind="documents_required")
    _refused(client.post("/v1/schedules", json={"cron": "@daily", "spec": _spec(root, out="s")}, headers=headers),
             422, "spec", "stages", kind="dedup_required")
    sched = client.post("/v1/schedules", json={"cron": "@daily", "spec": _spec(root, out="s", stages=DEDUP)},
                        headers=headers)
    assert sched.status_code == 201, sched.text
    url = f"/v1/schedules/{sched.json()['id']}"
    _refused(client.patch(url, json={"spec": _spec(root, out="s")}, headers=headers), 422, "spec", "stages",
             kind="dedup_required")
    _refused(client.patch(url, json={"spec": spec}, headers=headers), 409, "spec", "output", "path")
    nul = {**spec, "output": {"path": str(root / "s") + "\x00"}}
    _refused(client.patch(url, json={"spec": nul}, headers=headers), 422, "spec", "output", "path",
             kind="nul_character")
    assert client.patch(url, json={"spec": _spec(root, out="s", stages=DEDUP)}, headers=headers).status_code == 200

    def mix(*sources: dict[str, Any], **extra: Any):
        return client.post("/v1/mixtures", json={"sources": list(sources), **extra}, headers=headers)

    _refused(mix({"name": "a", "weight": 1}), 422, "sources", 0)
    _refused(mix({"name": "a", "job": "0123456789abcdef", "schedule": "0123456789abcdef", "weight": 1}), 422,
             "sources", 0)
    _refused(mix({"name": "a", "job": "0123456789abcdef", "weight": 1}), 404, "sources", 0, "job", kind="mixture")
    _refused(mix({"name": "a", "job": "0123456789abcdef", "weight": 1},
                 {"name": "a", "job": "0123456789abcdee", "weight": 1}), 422, "sources", 1, "name",
             kind="duplicate_name")
    _refused(mix({"name": "a", "job": "0123456789abcdef", "weight": 1}, seed=2**53), 422, "seed")


def test_the_schema_is_a_valid_openapi_document(openapi):
    from openapi_spec_validator import validate

    # FastAPI writes an event stream's items as OpenAPI 3.2's itemSchema, which a 3.1 document may not hold
    validate(_without_item_schemas(openapi))


def _without_item_schemas(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_item_schemas(v) for k, v in node.items() if k != "itemSchema"}
    return [_without_item_schemas(v) for v in node] if isinstance(node, list) else node

