"""Issue 37: a body or a spec file nested deeper than :data:`pipeline.nesting.MAX_DEPTH` is refused before a
parser that recurses sees it (a 422 of the documented problem-list form; on the command line one ``error:``
line and exit 2), and broken JSON of any kind is the same 422 form."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.nesting import MAX_DEPTH
from service import cli
from tests.test_service_api import _spec, api  # noqa: F401 - a fixture (SQLite and PostgreSQL)
from tests.test_service_store import postgres_url  # noqa: F401 - a fixture

ROUTES = ("/v1/jobs", "/v1/schedules", "/v1/mixtures")
#: ~2 KB each: 1,000 nested lists or maps, in YAML's flow style (JSON's too)
DEEP = {"lists": "[" * 1000 + "]" * 1000, "maps": "{a: " * 1000 + "1" + "}" * 1000}
DEEP_JSON = {"lists": "[" * 1000 + "]" * 1000, "maps": '{"a": ' * 1000 + "1" + "}" * 1000}


def _refused_for_depth(r) -> None:
    assert r.status_code == 422, r.text
    [problem] = r.json()["detail"]
    assert problem["loc"][0] == "body" and problem["type"] == "too_deep", problem
    assert f"deeper than {MAX_DEPTH} levels" in problem["msg"], problem


def test_deep_yaml_and_json_bodies_are_a_422_naming_the_limit_on_every_route(api):  # noqa: F811
    client, headers, root = api
    for route in ROUTES:
        for what, text in DEEP.items():
            yaml_body = f"name: x\nspec: {text}\n"
            r = client.post(route, content=yaml_body, headers={**headers, "Content-Type": "application/yaml"})
            _refused_for_depth(r)
            assert r.json()["detail"][0]["msg"].startswith("line 2, column "), (route, what)
            r = client.post(route, content=DEEP_JSON[what], headers={**headers, "Content-Type": "application/json"})
            _refused_for_depth(r)
        just = "[" * MAX_DEPTH + "]" * MAX_DEPTH  # at the limit: read, and refused for what it holds
        r = client.post(route, content=just, headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == 422 and r.json()["detail"][0]["type"] != "too_deep", r.text
        r = client.post(route, content='{"n": "' + "[" * 500 + '"}', headers=headers)  # brackets in a string
        assert r.status_code == 422 and r.json()["detail"][0]["type"] != "too_deep", r.text
    job = client.post("/v1/jobs", json=_spec(root), headers=headers)
    assert job.status_code == 201, job.text
    r = client.post(f"/v1/jobs/{job.json()['id']}/cancel", content=DEEP_JSON["lists"],  # a route without a body
                    headers={**headers, "Content-Type": "application/json"})
    assert r.status_code == 202, r.text  # ignores whatever is sent, as FastAPI does


@pytest.mark.parametrize("body", [b'{"name": "x", ', b'{"name": "\xff"}', b'{"n": ' + b"9" * 5000 + b"}"])
def test_broken_json_of_any_kind_is_one_422_form(api, body):  # noqa: F811
    client, headers, _ = api
    r = client.post("/v1/jobs", content=body, headers={**headers, "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    [problem] = r.json()["detail"]
    assert problem["loc"] == ["body"] and problem["type"] == "json_invalid" and problem["msg"], problem


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("command", ["run", "submit", "mix"])
def test_a_deep_spec_file_is_one_error_line_and_exit_2(tmp_path: Path, capsys, command, suffix):
    deep = DEEP["maps"] if suffix == ".yaml" else DEEP_JSON["maps"]
    spec = tmp_path / f"spec{suffix}"
    for text in (deep, "{" + '"name": ' + deep + "}" if suffix == ".json" else f"name: {deep}\n"):
        spec.write_text(text)
        argv = [command, str(spec)] + (["--server", "http://127.0.0.1:9"] if command == "submit" else [])
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: "), err
        assert f"deeper than {MAX_DEPTH} levels" in err and str(spec) in err, err


def test_an_alias_counts_the_levels_of_the_node_it_names(tmp_path: Path, capsys):
    spec = tmp_path / "spec.yaml"
    half = MAX_DEPTH // 2 + 1
    chained = f"a: &a {'[' * half}{']' * half}\nname: {'[' * half}*a{']' * half}\n"  # each within it; not both
    for text in (chained, "name: &n [1, *n]\n"):  # and a list that holds itself
        spec.write_text(text)
        assert cli.main(["run", str(spec)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {spec}:2:") or err.startswith(f"error: {spec}:1:"), err
        assert f"deeper than {MAX_DEPTH} levels" in err and err.count("\n") == 1, err
    spec.write_text(f"a: &a {'[' * half}{']' * half}\nname: [*a]\n")  # within the limit: the schema's to refuse
    assert cli.main(["run", str(spec)]) == 2
    assert "deeper than" not in capsys.readouterr().err


def test_tokenmill_card_refuses_a_deep_spec_beside_the_card(tmp_path: Path, capsys):
    from tests.test_card import _output

    out = _output(tmp_path / "out")
    (out / "card").mkdir()
    (out / "card" / "spec.yaml").write_text(f"name: {DEEP['lists']}\n")
    assert cli.main(["card", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {out / 'card' / 'spec.yaml'}:1:"), err
    assert f"deeper than {MAX_DEPTH} levels" in err, err
