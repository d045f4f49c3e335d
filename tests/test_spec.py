"""An invalid spec is refused before any work, naming the field path; the CLI exits 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from pipeline.preflight import checked, load_checked
from pipeline.problems import NO_MATCH, ParamError, Problem
from pipeline.spec import SpecError, load_spec, parse_spec


def _spec(tmp_path, **over):
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    spec = {
        "name": "t",
        "inputs": [{"path": str(tmp_path / "in.jsonl")}],
        "stages": [{"type": "normalize"}],
        "packing": {"seq_len": 64},
        "output": {"path": str(tmp_path / "out")},
    }
    spec.update(over)
    return spec


def test_valid_spec_loads_from_yaml_and_json(tmp_path):
    data = _spec(tmp_path)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "s.json").write_text(__import__("json").dumps(data))
    a, b = load_spec(tmp_path / "s.yaml"), load_spec(tmp_path / "s.json")
    assert a == b and a.packing.seq_len == 64
    assert a.content_hash() == b.content_hash()


def test_hash_ignores_execution_and_output_place(tmp_path):
    a = parse_spec(_spec(tmp_path))
    b = parse_spec(_spec(tmp_path, execution={"parallelism": 2}, output={"path": str(tmp_path / "o2")}))
    c = parse_spec(_spec(tmp_path, packing={"seq_len": 65}))
    assert a.content_hash() == b.content_hash() != c.content_hash()


def test_a_field_added_later_keeps_earlier_specs_hashes():
    """Resuming unfinished work and a schedule's versions compare spec hashes: a new field's default must not
    change the hash of a spec written before it (this one's hash before ``output.rejected_sample``); a value of
    its own does."""
    spec = {"name": "t", "inputs": [{"path": "in/*.jsonl"}], "output": {"path": "out"}}
    before = "dd1d68fc4ad347e5e403c4af6612575fb242d765e50f683ed3ea317e8da9dae4"
    assert parse_spec(spec).content_hash() == before, "a new field changed every spec's hash: leave its default out"
    sampled = parse_spec({**spec, "output": {"path": "out", "rejected_sample": 0.01}})
    assert sampled.output.rejected_sample == 0.01 and sampled.content_hash() != before


@pytest.mark.parametrize(
    "over, field",
    [
        ({"stages": [{"type": "normalize"}, {"type": "no_such_stage"}]}, "stages.1.type"),
        ({"packing": {"seq_len": -5}}, "packing.seq_len"),
        ({"inputs": [{"path": "/nonexistent/*.jsonl"}]}, "inputs.0.path"),
        ({"stages": [{"type": "length", "params": {"min_chars": "many"}}]}, "stages.0.params.min_chars"),
        ({"stages": [{"type": "length", "params": {"bogus": 1}}]}, "stages.0.params.bogus"),
        ({"name": ""}, "name"),
        ({"output": {}}, "output.path"),
        ({"output": {"path": "o", "rejected_sample": 0}}, "output.rejected_sample"),
    ],
)
def test_invalid_spec_names_the_field(tmp_path, over, field):
    with pytest.raises(SpecError) as err:
        checked(_spec(tmp_path, **over))
    assert str(err.value).startswith(field + ":"), str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_missing_inputs_field(tmp_path):
    data = _spec(tmp_path)
    del data["inputs"]
    with pytest.raises(SpecError, match=r"^inputs: Field required"):
        parse_spec(data)


@pytest.mark.parametrize(
    "over, field, value",
    [
        ({"stages": [{"type": "no_such_stage"}]}, "stages.0.type", "no_such_stage"),
        ({"packing": {"seq_len": -1}}, "packing.seq_len", "seq_len: -1"),
        ({"inputs": [{"path": "missing/*.jsonl"}]}, "inputs.0.path", "missing/*.jsonl"),
    ],
)
def test_cli_refuses_invalid_spec_with_exit_2(tmp_path, over, field, value):
    """One line, naming the field and the YAML line its value is on."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_spec(tmp_path, **over)))
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if value in text)
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "run", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field} (line {line}):"), proc.stderr


def test_cli_reports_unreadable_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "run", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {path}:2:1: "), proc.stderr  # where the parser stopped: the end


def test_missing_tokenizer_file_is_refused_before_work(tmp_path):
    with pytest.raises(SpecError, match=r"^tokenizer.path: no such file"):
        checked(_spec(tmp_path, tokenizer={"path": str(tmp_path / "nope.json")}))


def test_relative_dedup_against_resolves_against_the_spec_folder(tmp_path, monkeypatch):
    """Like inputs: a spec file's relative ``dedup_against`` (str or list) is relative to its folder,
    absolute ones stay; a spec built in code keeps its paths as given."""
    folder = tmp_path / "specs"
    folder.mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    stages = [{"type": "exact_dedup", "params": {"dedup_against": "../earlier"}},
              {"type": "near_dedup", "params": {"dedup_against": ["../earlier", "/abs/out", ""]}},
              {"type": "exact_dedup", "params": {"dedup_against": ""}},
              {"type": "near_dedup"}]
    (folder / "s.yaml").write_text(yaml.safe_dump(_spec(folder, stages=stages)))
    spec = load_spec(folder / "s.yaml")
    base = folder.resolve()
    assert spec.stage_params(0).dedup_against == str(base.parent / "earlier")  # normalised: no ".." left
    assert spec.stage_params(1).dedup_against == [str(base.parent / "earlier"), "/abs/out", ""]
    assert spec.stage_params(2).dedup_against == "" and spec.stage_params(3).dedup_against is None
    in_code = parse_spec(_spec(folder, stages=stages))
    assert in_code.stage_params(0).dedup_against == "../earlier"
    assert in_code.stage_params(1).dedup_against == ["../earlier", "/abs/out", ""]


def test_home_paths_in_a_spec_file_are_the_users_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    folder = tmp_path / "specs"
    folder.mkdir()
    spec = _spec(folder, stages=[{"type": "exact_dedup", "params": {"dedup_against": "~/earlier"}}])
    spec["output"]["path"] = "~/out"
    (folder / "s.yaml").write_text(yaml.safe_dump(spec))
    loaded = load_spec(folder / "s.yaml")
    assert loaded.stage_params(0).dedup_against == str(home / "earlier")
    assert loaded.output.path == str(home / "out")


def test_wrong_relative_dedup_against_is_refused_naming_field_and_resolved_path(tmp_path, monkeypatch):
    folder = tmp_path / "specs"
    folder.mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    stages = [{"type": "near_dedup", "params": {"dedup_against": ["../no_such_out"]}}]
    (folder / "s.yaml").write_text(yaml.safe_dump(_spec(folder, stages=stages)))
    with pytest.raises(SpecError) as err:
        load_checked(folder / "s.yaml")
    assert str(err.value).startswith("stages.0.params.dedup_against (line "), str(err.value)
    assert repr(str(folder.resolve().parent / "no_such_out")) in str(err.value)  # resolved, no ".." left
    assert len(str(err.value).splitlines()) == 1


def test_cli_unwritable_output_exits_2_and_unreachable_cluster_exits_1(tmp_path):
    """An output that cannot be written is the spec's fault (2); a cluster that does not answer is ``infra`` (1)."""
    (tmp_path / "file").write_text("x")
    for over, field, code in (
        ({"output": {"path": str(tmp_path / "file" / "out")}}, "output.path", 2),
        ({"execution": {"address": "127.0.0.1:1"}}, "execution.address", 1),
    ):
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(_spec(tmp_path, **over)))
        proc = subprocess.run(
            [sys.executable, "-m", "service.cli", "run", str(path)], capture_output=True, text=True, timeout=180
        )
        assert proc.returncode == code, proc.stderr[-2000:]
        assert f"error: {field}:" in proc.stderr and "Traceback" not in proc.stderr


def test_a_stage_validator_error_names_the_params_field_cleanly(tmp_path):
    """Issue 9, case 14: a stage's own model validator (near_dedup: bands without rows) used to print
    `stages.0.params.: Value error, ...` (empty field, pydantic's prefix left in)."""
    with pytest.raises(SpecError) as err:
        parse_spec(_spec(tmp_path, stages=[{"type": "near_dedup", "params": {"bands": 4}}]))
    assert str(err.value) == "stages.0.params: give both bands and rows, or neither"
    with pytest.raises(SpecError) as err:
        parse_spec(_spec(tmp_path, stages=[{"type": "normalize"},
                                           {"type": "near_dedup", "params": {"bands": 64, "rows": 4}}]))
    assert str(err.value) == "stages.1.params: bands x rows = 256 exceeds num_perm = 128"


def test_two_annotate_mode_instances_of_one_filter_are_refused(tmp_path):
    """Both would write meta.filters.length: the second verdict would silently replace the first."""
    def stages(*modes):
        return [{"type": "normalize"}] + [{"type": "length", "params": {"mode": m, "min_chars": 10 * (k + 1)}}
                                          for k, m in enumerate(modes)]

    with pytest.raises(SpecError) as err:
        checked(_spec(tmp_path, stages=stages("annotate", "annotate")))
    msg = str(err.value)
    assert msg.startswith("stages.2.params.mode:") and "stages.1" in msg and "meta.filters.length" in msg, msg
    # one annotates, the other filters; or two different filters annotate: nothing is overwritten
    checked(_spec(tmp_path, stages=stages("annotate", "filter")))
    checked(_spec(tmp_path, stages=[*stages("annotate"), {"type": "c4", "params": {"mode": "annotate"}}]))


def test_each_problem_is_a_problem_at_its_field_and_none_is_a_parsed_string(tmp_path):
    """Issue 21: a schema error, bad stage params (a field's, a stage validator's, a preflight's) and a missing
    input file each reach the caller as a Problem with its loc; no message keeps pydantic's prefix."""
    missing = str(tmp_path / "missing" / "*.jsonl")
    bad = _spec(tmp_path, packing={"seq_len": 0}, inputs=[{"path": missing}],
                stages=[{"type": "length", "params": {"min_chars": "many"}},
                        {"type": "near_dedup", "params": {"bands": 4}},
                        {"type": "pii", "params": {"entities": ["NOPE"]}}])
    with pytest.raises(SpecError) as err:
        checked(bad)  # one round: every field's schema problem, and the file checks of the parts that are valid
    found = {p.loc: p for p in err.value.problems}
    assert set(found) == {("stages", 0, "params", "min_chars"), ("stages", 1, "params"),
                          ("stages", 2, "params", "entities"), ("packing", "seq_len"), ("inputs", 0, "path")}
    assert found[("inputs", 0, "path")].kind == NO_MATCH
    assert found[("stages", 1, "params")].msg == "give both bands and rows, or neither"
    assert found[("stages", 2, "params", "entities")].msg.startswith("unknown ['NOPE']")
    assert str(err.value).splitlines() == [str(p) for p in err.value.problems]

    schema_ok = _spec(tmp_path, inputs=[{"path": missing}], stages=[
        {"type": "decontaminate", "params": {"benchmarks": [str(tmp_path / "no_bench.jsonl")]}}])
    with pytest.raises(SpecError) as err:
        checked(schema_ok)
    assert [(p.loc, p.kind) for p in err.value.problems] == [
        (("inputs", 0, "path"), NO_MATCH), (("stages", 0, "params", "benchmarks"), NO_MATCH)]
    assert err.value.problems[0].msg == f"no file matches {missing!r}"
    for problems in (list(found.values()), err.value.problems):
        assert not any(p.msg.startswith("Value error") or p.msg.startswith(p.field) for p in problems), problems


def test_a_problem_formats_as_field_colon_message_and_as_a_422_item():
    p = Problem(("stages", 0, "params", "min_chars"), "bad", "int_parsing")
    assert str(p) == "stages.0.params.min_chars: bad"
    assert str(Problem((), "must be a mapping")) == "spec: must be a mapping"
    assert p.detail("body") == {"loc": ["body", "stages", 0, "params", "min_chars"], "msg": "bad",
                                "type": "int_parsing"}
    err = ParamError("benchmarks", "no file matches 'x'", NO_MATCH)
    assert str(err) == "benchmarks: no file matches 'x'"
    assert err.problem(("stages", 2, "params"), "preflight") == Problem(
        ("stages", 2, "params", "benchmarks"), "no file matches 'x'", NO_MATCH)


def test_an_unknown_stage_names_the_closest_known_one():
    """A typo gets the stage it most likely meant; a name like none of them gets only the list."""
    def problem(stage: str) -> str:
        with pytest.raises(SpecError) as info:
            parse_spec({"name": "x", "inputs": [{"path": "a.jsonl"}], "stages": [{"type": stage}],
                        "output": {"path": "out"}})
        [p] = [p for p in info.value.problems if p.loc == ("stages", 0, "type")]
        return p.msg

    assert problem("exact_dedupe").startswith("unknown stage 'exact_dedupe' (did you mean 'exact_dedup'? known: c4, ")
    assert problem("gopher_qualty").startswith("unknown stage 'gopher_qualty' (did you mean 'gopher_quality'? ")
    assert problem("zzz").startswith("unknown stage 'zzz' (known: c4, ")
