"""``tokenmill run --set key.path=value``, ``--dry-run`` and ``--limit N`` (issue 39, tokenmill as a library).

Every test but the last runs without Ray: ``--set`` is a change to the spec's data before validation (in the spec
hash like any field), ``--dry-run`` validates, matches the inputs and computes the workers by the graph's own rules;
the last runs one small job with ``--limit`` and ``--set`` together.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline.documents import Drop
from pipeline.job.plan_view import pools
from pipeline.job.pools import fused_into_readers
from pipeline.overrides import apply_override, load_spec_with, parse_override
from pipeline.problems import SpecError
from pipeline.readers import expand_inputs, first_documents
from pipeline.readers.limit import limit_files
from pipeline.spec import InputSpec, parse_spec
from service.commands import submit
from service.commands.run import main as run_main


def _corpus(folder: Path, files: int = 3, docs: int = 4, name: str = "p") -> Path:
    """``files`` JSONL files of ``docs`` documents each; document ``f-i``'s text is ``10 + i`` characters."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        (folder / f"{name}{f}.jsonl").write_text("".join(
            json.dumps({"id": f"{name}{f}-{i}", "text": "w" * (10 + i)}) + "\n" for i in range(docs)))
    return folder


def _spec(tmp_path: Path, **extra: object) -> Path:
    spec = {"name": "flags", "inputs": [{"path": "in/*.jsonl"}],
            "stages": [{"type": "normalize"}, {"type": "length", "params": {"min_chars": 1}}],
            "tokenizer": None, "output": {"path": "out", "documents": "jsonl"}, **extra}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# ---- --set ---------------------------------------------------------------------------------------------------


def test_set_values_are_yaml_and_paths_walk_keys_and_indices():
    values = {"true": True, "3": 3, "0.5": 0.5, "[a, b]": ["a", "b"], "'\"3\"'": '"3"', '"3"': "3", "": None,
              "out/x": "out/x", "{min_chars: 4}": {"min_chars": 4}}
    for text, value in values.items():
        assert parse_override(f"a.b={text}").value == value, text
    data = {"stages": [{"type": "normalize"}, {"type": "length", "params": {}}], "output": {"path": "o"}}
    assert apply_override(data, parse_override("stages.1.params.min_chars=50")) == ("stages", 1, "params", "min_chars")
    apply_override(data, parse_override("execution.parallelism=4"))  # a missing mapping on the way is added
    assert data["stages"][1]["params"] == {"min_chars": 50} and data["execution"] == {"parallelism": 4}
    for text, why in [("stages.9.params.x=1", "stages has 2 entries"),
                      ("stages.x=1", "stages has 2 entries; 'x' is not an index (0, 1, ...)"),
                      ("output.path.x=1", "output.path is str 'o', not a mapping or a list")]:
        with pytest.raises(SpecError) as err:
            apply_override(data, parse_override(text))
        assert str(err.value) == f"--set {text}: {why}"
    for text in ["nokey", "=1", "a..b=1"]:
        with pytest.raises(SpecError, match=r"expected key\.path=value"):
            parse_override(text)


def test_set_is_in_the_spec_hash_like_the_files_own_field(tmp_path):
    path = _spec(tmp_path)
    _corpus(tmp_path / "in")
    plain = load_spec_with(path, []).content_hash()
    assert load_spec_with(path, ["stages.1.params.min_chars=1"]).content_hash() == plain  # the file's value
    changed = load_spec_with(path, ["stages.1.params.min_chars=12"])
    assert changed.stages[1].params == {"min_chars": 12} and changed.content_hash() != plain
    out = load_spec_with(path, ["output.path=elsewhere"], check_files=False)  # relative to the command's folder
    assert out.output.path == str(Path.cwd() / "elsewhere") and out.content_hash() == plain


def test_a_bad_set_is_one_line_naming_the_flag_exit_2(tmp_path, capsys):
    path = _spec(tmp_path)
    _corpus(tmp_path / "in")
    assert run_main([str(path), "--dry-run", "--set", "stages.9.params.x=1"]) == 2
    assert capsys.readouterr().err == "error: --set stages.9.params.x=1: stages has 2 entries\n"
    assert run_main([str(path), "--dry-run", "--set", "foo=1", "--set", "stages.1.params.min_chars=-1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: stages.1.params.min_chars: ") and err[0].endswith(
        "(--set stages.1.params.min_chars=-1)")  # the flag, not the file's line, that gave the value
    assert err[1].startswith("error: foo: ") and err[1].endswith("(--set foo=1)") and len(err) == 2


def test_submit_sends_the_spec_with_its_sets(tmp_path, monkeypatch, capsys):
    """``submit --set`` builds the spec on the client as ``run`` does (the files are the server's to check)."""
    sent: list[dict] = []

    class Api:
        def __init__(self, *args: object) -> None:
            pass

        def request(self, method: str, path: str, json: dict, headers: dict) -> object:
            sent.append(json)
            return type("Reply", (), {"json": lambda self: {"id": "j1"}})()

    monkeypatch.setattr(submit, "Api", Api)
    path = _spec(tmp_path)  # no input files: not checked here
    assert submit.main([str(path), "--set", "stages.1.params.min_chars=12", "--set", "execution.parallelism=3"]) == 0
    assert sent[0]["stages"][1]["params"] == {"min_chars": 12} and sent[0]["execution"]["parallelism"] == 3
    assert submit.main([str(path), "--set", "stages.5.type=x"]) == 2 and not sent[1:]
    assert capsys.readouterr().err == "error: --set stages.5.type=x: stages has 2 entries\n"


# ---- --dry-run -----------------------------------------------------------------------------------------------


def test_dry_run_lists_files_stages_and_workers_and_writes_nothing(tmp_path, capsys, no_ray):
    import ray

    path = _spec(tmp_path, execution={"parallelism": 2})
    _corpus(tmp_path / "in", files=3)
    assert run_main([str(path), "--dry-run", "--set", "stages.1.params.min_chars=12"]) == 0
    text = capsys.readouterr().out
    size = (tmp_path / "in" / "p0.jsonl").stat().st_size
    assert f"3 files, {3 * size} B" in text and f"p2.jsonl  {size} B" in text
    assert "1. normalize  (defaults)" in text and "2. length  min_chars=12" in text
    assert "Ray: 2 workers per stage (execution.parallelism)" in text
    assert "read: 2 actors x 1 CPU" in text and "1. normalize, 2. length: 2 actors x 1 CPU" in text
    assert not (tmp_path / "out").exists() and not ray.is_initialized()
    assert run_main([str(path), "--dry-run", "--set", "stages.0.type=nope"]) == 2  # invalid: exit 2, the field
    assert capsys.readouterr().err.startswith("error: stages.0.type: unknown stage 'nope'")
    assert not (tmp_path / "out").exists() and not ray.is_initialized()


def test_the_plan_follows_the_graphs_pooling_rules():
    stages = [{"type": "normalize"}, {"type": "length"}, {"type": "exact_dedup"}, {"type": "length"}]
    spec = parse_spec({"name": "p", "inputs": [{"path": "x"}], "stages": stages, "tokenizer": None,
                       "output": {"path": "o", "documents": "jsonl"}})
    assert [(p.what, p.actors, p.tasks) for p in pools(spec, files=3, par=2)] == [
        ("read", 2, False), ("1. normalize, 2. length", 2, False), ("3. exact_dedup (a dataset stage)", None, True),
        ("4. length", 2, False)]
    many = pools(spec, files=4, par=2)  # files enough for every worker: the first stages run in the readers
    assert fused_into_readers(True, {"num_cpus": 1}, 4, 2) and many[0].what == (
        "read + 1. normalize, 2. length in the readers' workers")
    assert [p.what for p in many[1:]] == ["3. exact_dedup (a dataset stage)", "4. length"]


# ---- --limit: the readers stop ---------------------------------------------------------------------------


def test_reading_stops_at_the_limit_and_files_after_it_are_not_opened(tmp_path):
    pulled: list[int] = []

    def items():
        for i in range(100):
            pulled.append(i)
            yield Drop({"ord": i}, "bad") if i == 1 else {"ord": i}

    assert len(list(first_documents(items(), 3))) == 4 and pulled == [0, 1, 2, 3]  # a drop does not count
    _corpus(tmp_path / "a", files=3, docs=4)
    _corpus(tmp_path / "b", files=1, docs=20, name="q")
    inputs = [InputSpec(path=str(tmp_path / "a"), limit=6), InputSpec(path=str(tmp_path / "b"))]
    listed, to_read = limit_files(expand_inputs(inputs))
    assert [(i, Path(p).name) for i, _, p in listed] == [(0, "p0.jsonl"), (1, "p1.jsonl"), (3, "q0.jsonl")]
    assert [s.limit for _, s, _ in to_read] == [4, 2, None] and listed[0][1] is inputs[0]


# ---- --limit and --set in one small job ----------------------------------------------------------------------


def test_limit_runs_the_first_documents_into_a_scratch_output(tmp_path, capsys, ray_shared):
    _corpus(tmp_path / "in", files=3, docs=4)
    path = _spec(tmp_path)
    assert run_main([str(path), "--limit", "5", "--set", "stages.1.params.min_chars=12"]) == 0
    assert not (tmp_path / "out").exists()  # the real output is not touched
    scratch = tmp_path / "out.limit-5"
    assert f"--limit 5: a quick look, in {scratch}" in capsys.readouterr().out
    stats = json.loads((scratch / "stats.json").read_text())
    read, _, length = stats["stages"]
    assert read["docs_in"] == 5 and stats["inputs"][0]["files"] == 2  # p0's 4, then p1's first: p2 never read
    assert length["dropped"] == {"too_short": 3}  # the --set: 10 and 11 characters are under 12 (p0-0, p0-1, p1-0)
    kept = [json.loads(line)["id"] for f in sorted((scratch / "documents").iterdir()) for line in f.open()]
    assert kept == ["p0-2", "p0-3"]
