"""Stages of one's own, without editing the repository (pipeline/stages/custom.py): ``module:Class`` in a spec,
and the ``tokenmill.stages`` entry points of installed packages, validated like built-in stages.

One job (``test_a_job_runs_installed_and_referenced_stages``) installs examples/tokenmill-stage-example into a
temporary folder (never the venv) and runs its stage by entry-point name and by ``module:Class``, plus a stage
from the spec's own folder, which Ray's workers cannot import (it travels by value). The rest runs without Ray.
"""

from __future__ import annotations

import contextvars
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from pipeline.problems import SpecError
from pipeline.spec import load_spec, parse_spec
from pipeline.stages import FilterStage, custom, known_stages, stage_class

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tokenmill-stage-example"

#: a stage module written next to a spec (the name is unique to this test module: sys.modules is shared)
LOCAL_STAGE = '''
from tokenmill import FilterParams, FilterStage


class NoGammaParams(FilterParams):
    word: str = "gamma"


class NoGamma(FilterStage):
    name = "no_gamma"
    Params = NoGammaParams

    def filter(self, doc):
        return "no_gamma:found" if self.params.word in doc["text"].split() else True
'''


class Shout(FilterStage):
    """A stage an entry point below points at."""

    name = "shout"

    def filter(self, doc):
        return True


def _spec(tmp: Path, stages: list[dict]) -> Path:
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump({"name": "custom", "inputs": [{"path": "in.jsonl"}], "stages": stages,
                                    "tokenizer": None, "output": {"path": "out", "documents": "jsonl"},
                                    "execution": {"parallelism": 1, "num_cpus": 2}},
                                   sort_keys=False))
    return path


@pytest.fixture
def local_module(tmp_path: Path) -> Iterator[str]:
    """A stage module in ``tmp_path`` (not on sys.path), removed from sys.modules afterwards."""
    name = f"local_stages_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(LOCAL_STAGE)
    yield name
    sys.modules.pop(name, None)
    custom._TRAVELLING.pop(name, None)


def test_a_module_class_next_to_the_spec_is_validated_like_a_built_in(tmp_path: Path, local_module: str) -> None:
    ok = load_spec(_spec(tmp_path, [{"type": f"{local_module}:NoGamma", "params": {"word": "delta"}}]))
    assert ok.stage_params(0).word == "delta"
    assert stage_class(ok.stages[0].type).name == "no_gamma"
    assert local_module in {m.__name__ for m in custom.travelling_modules()}  # shipped to workers by value
    assert str(tmp_path) not in sys.path  # the spec's folder was on the path only while importing

    with pytest.raises(SpecError) as caught:
        load_spec(_spec(tmp_path, [{"type": f"{local_module}:NoGamma", "params": {"word": ["x"]}},
                                   {"type": "no_such_pkg.filters:Mine"},
                                   {"type": f"{local_module}:Nothing"},
                                   {"type": "json:JSONDecoder"}]))
    assert str(caught.value).splitlines() == [
        "stages.0.params.word (line 8): Input should be a valid string",
        "stages.1.type (line 9): cannot import no_such_pkg.filters: No module named 'no_such_pkg'",
        f"stages.2.type (line 10): {local_module} has no 'Nothing'",
        "stages.3.type (line 11): json:JSONDecoder is not a stage: subclass pipeline.stages.Stage, FilterStage or "
        "DatasetStage",
    ]


def test_only_what_the_workers_cannot_import_travels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module from the spec's folder, and one it imports from there, go to Ray's workers by value; a module the
    workers can import as usual (on the path already) does not."""
    names = ["helper_words_t1", "uses_helper_t1", "on_path_stage_t1"]
    (tmp_path / "helper_words_t1.py").write_text("WORDS = {'gamma'}\n")
    (tmp_path / "uses_helper_t1.py").write_text("from helper_words_t1 import WORDS\n" + LOCAL_STAGE)
    on_path = tmp_path / "on_path"
    on_path.mkdir()
    (on_path / "on_path_stage_t1.py").write_text(LOCAL_STAGE)
    monkeypatch.syspath_prepend(str(on_path))
    try:
        load_spec(_spec(tmp_path, [{"type": "uses_helper_t1:NoGamma"}]))
        load_spec(_spec(on_path, [{"type": "on_path_stage_t1:NoGamma"}]))
        travelling = {m.__name__ for m in custom.travelling_modules()}
        assert {"uses_helper_t1", "helper_words_t1"} <= travelling
        assert "on_path_stage_t1" not in travelling
    finally:
        for name in names:
            sys.modules.pop(name, None)
            custom._TRAVELLING.pop(name, None)


def test_a_module_that_fails_to_import_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken_stage_module.py").write_text("raise RuntimeError('no config file')\n")
    with pytest.raises(SpecError) as caught:
        load_spec(_spec(tmp_path, [{"type": "broken_stage_module:X"}]))
    assert str(caught.value) == ("stages.0.type (line 5): cannot import broken_stage_module: RuntimeError: "
                                 "no config file")


@pytest.fixture
def entry_points(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[SimpleNamespace]]:
    """The installed ``tokenmill.stages`` entry points, as the test lists them."""
    eps: list[SimpleNamespace] = []
    monkeypatch.setattr(custom, "entry_points", lambda group: [e for e in eps if group == custom.ENTRY_POINT_GROUP])
    custom.installed.cache_clear()
    yield eps
    custom.installed.cache_clear()


def _ep(name: str, value: str, package: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, value=value, dist=SimpleNamespace(name=package))


def _problems(stages: list[dict]) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec({"name": "x", "inputs": [{"path": "/in"}], "stages": stages, "output": {"path": "/out"}})
    return str(caught.value).splitlines()


def test_an_entry_point_names_a_stage_after_the_built_ins(entry_points: list[SimpleNamespace]) -> None:
    entry_points.append(_ep("shout", f"{__name__}:Shout", "shout-pkg"))
    spec = parse_spec({"name": "x", "inputs": [{"path": "/in"}], "stages": [{"type": "shout"}, {"type": "length"}],
                       "output": {"path": "/out"}})
    assert stage_class(spec.stages[0].type) is Shout
    assert "shout" in known_stages()
    assert _problems([{"type": "shout", "params": {"loud": True}}])[0].startswith("stages.0.params.loud: ")
    assert "did you mean 'shout'?" in _problems([{"type": "shoot"}])[0]

    entry_points.append(_ep("broken", "no_such_pkg.stages:Broken", "broken-pkg"))
    custom.installed.cache_clear()  # read once per process: a package installed since is seen by the next one
    assert _problems([{"type": "broken"}]) == [
        "stages.0.type: entry point 'broken' (broken-pkg): cannot import no_such_pkg.stages: No module named "
        "'no_such_pkg'"]


def test_an_entry_point_cannot_take_a_built_in_or_another_packages_name(entry_points: list[SimpleNamespace]) -> None:
    entry_points += [_ep("length", f"{__name__}:Shout", "sneaky"), _ep("shout", f"{__name__}:Shout", "a"),
                     _ep("shout", "other.mod:Shout", "b")]
    assert _problems([{"type": "length"}, {"type": "shout"}]) == [
        f"stages.0.type: 'length' is a built-in stage, and the tokenmill.stages entry point {__name__}:Shout "
        "(package sneaky) takes the same name: an installed stage cannot replace a built-in; rename the entry point",
        f"stages.1.type: 'shout' is declared by several tokenmill.stages entry points: {__name__}:Shout (package a), "
        "other.mod:Shout (package b); uninstall or rename all but one"]


def test_where_references_are_refused_none_is_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A service refuses ``module:Class`` for its requests (service/api/edge.py) before importing anything."""
    (tmp_path / "imported_marker_stage.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def refused() -> list[str]:
        custom.refuse_references("not here")
        return _problems([{"type": "imported_marker_stage:X"}])

    assert contextvars.copy_context().run(refused) == [
        "stages.0.type: 'imported_marker_stage:X': not here"]
    assert not (tmp_path / "imported").exists()
    assert _problems([{"type": "imported_marker_stage:X"}]) == [  # elsewhere, the same process imports it
        "stages.0.type: imported_marker_stage has no 'X'"]
    assert (tmp_path / "imported").exists()
    sys.modules.pop("imported_marker_stage", None)


def test_the_service_refuses_a_module_class_stage(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.api.edge import NO_REFERENCES
    from service.settings import Settings
    from service.store import repo

    settings = Settings(state_dir=tmp_path / "state", database_url=f"sqlite:///{tmp_path / 'api.db'}",
                        input_roots=(tmp_path,), output_roots=(tmp_path,), run_supervisor=False)
    spec = {"name": "x", "inputs": [{"path": str(tmp_path / "in.jsonl")}], "output": {"path": str(tmp_path / "o")},
            "stages": [{"type": "json:JSONDecoder"}]}
    app = create_app(settings)
    with TestClient(app) as client:
        with app.state.db.session() as s:
            _, token = repo.create_key(s, "test")
        r = client.post("/v1/jobs", json=spec, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "stages", 0, "type"]
    assert r.json()["detail"][0]["msg"] == f"'json:JSONDecoder': {NO_REFERENCES}"


# ---- one job: the example package by entry point and by module:Class, and a module next to the spec -------


def _install_example(target: Path, scratch: Path) -> None:
    """pip install the example into ``target`` (offline, the venv untouched; built from a copy: no build/ left
    in the repository)."""
    source = scratch / "example"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(source)], check=True, capture_output=True, timeout=120)


def test_a_job_runs_installed_and_referenced_stages(tmp_path: Path) -> None:
    _install_example(tmp_path / "site", tmp_path)
    job = tmp_path / "job"
    job.mkdir()
    (job / "near_stages.py").write_text(LOCAL_STAGE)
    texts = ["alpha one", "beta two", "gamma three", "delta four", "ALPHA five", "beta gamma six", "epsilon"]
    (job / "in.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    spec = _spec(job, [
        {"type": "blocklist", "params": {"words": ["alpha"]}},  # the example's entry point
        {"type": "tokenmill_stage_example.filters:Blocklist", "params": {"words": ["beta"]}},  # module:Class
        {"type": "near_stages:NoGamma"},  # next to the spec: not importable by the workers
    ])
    with tempfile.TemporaryDirectory(prefix="tm-") as ray_tmp:  # short: Ray's socket paths have a length limit
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path / "site")]), "RAY_TMPDIR": ray_tmp}
        run = subprocess.run([sys.executable, "-m", "service.cli", "run", str(spec)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr

    stats = json.loads((job / "out" / "stats.json").read_text())
    dropped = {s["stage"]: s["dropped"] for s in stats["stages"] if s["stage"] != "00-read"}
    assert dropped == {"01-blocklist": {"blocklist:listed_word": 2}, "02-blocklist": {"blocklist:listed_word": 2},
                       "03-no_gamma": {"no_gamma:found": 1}}
    kept = [json.loads(line)["id"] for f in sorted((job / "out" / "documents").glob("part-*.jsonl"))
            for line in f.read_text().splitlines()]
    assert kept == ["d3", "d6"]
