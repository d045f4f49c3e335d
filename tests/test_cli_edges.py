"""The command line's edges (issue 22): options on either side of ``apikey``'s action, ``serve``'s ready line,
``--version``, help for every positional, ``submit``'s absolute paths, every spec problem in one round, and
YAML syntax errors with their line and column."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path

import httpx
import pytest
import yaml

from pipeline.preflight import checked, load_checked
from pipeline.problems import NO_MATCH, SpecError
from pipeline.spec import load_spec, resolve_paths
from service import cli
from service.commands.apikey import main as main_apikey
from service.commands.cancel import main as main_cancel
from service.commands.status import main as main_status
from service.commands.submit import main as main_submit
from tests.live_api import live_api

ROOT = Path(__file__).resolve().parent.parent


def _run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd or ROOT, env=env)


# ---- 1. apikey: the store's options before or after the action --------------------------------------------


def test_apikey_takes_its_options_before_or_after_the_action(tmp_path, capsys):
    state = str(tmp_path / "svc")
    assert main_apikey(["create", "--state-dir", state, "--name", "me"]) == 0
    token = capsys.readouterr().out.strip()
    assert token
    assert main_apikey(["--state-dir", state, "create", "--name", "other"]) == 0
    capsys.readouterr()
    for argv in (["list", "--state-dir", state], ["--state-dir", state, "list"]):
        assert main_apikey(argv) == 0
        names = [line.split()[-1] for line in capsys.readouterr().out.splitlines()]
        assert sorted(names) == ["me", "other"], argv
    # a database option after the action, the state dir before it: both are read
    db = f"sqlite:///{tmp_path / 'svc' / 'tokenmill.db'}"
    assert main_apikey(["--state-dir", str(tmp_path / "elsewhere"), "list", "--database-url", db]) == 0
    key_id = next(line.split()[0] for line in capsys.readouterr().out.splitlines() if line.endswith(" me"))
    assert main_apikey(["revoke", key_id, "--state-dir", state]) == 0
    capsys.readouterr()
    assert main_apikey(["list", "--state-dir", state]) == 0
    assert next(line for line in capsys.readouterr().out.splitlines() if line.startswith(key_id)).split()[1] \
        == "revoked"
    assert not (tmp_path / "elsewhere" / "tokenmill.db").exists()  # --database-url won over the state dir's file


@pytest.mark.parametrize("main, argv", [
    (main_status, ["JOB", "--server", "http://127.0.0.1:9", "--api-key", "k"]),
    (main_cancel, ["JOB", "--server", "http://127.0.0.1:9", "--api-key", "k"]),
    (main_submit, ["SPEC", "--server", "http://127.0.0.1:9", "--api-key", "k", "--json"]),
])
def test_http_commands_take_their_options_after_the_positional(main, argv, tmp_path, capsys):
    """Parsed (exit 1: nothing listens on the port, named in the error), not refused as an unknown argument."""
    if main is main_submit:
        spec = tmp_path / "s.yaml"
        spec.write_text(yaml.safe_dump({"name": "x", "inputs": [{"path": "a.jsonl"}], "output": {"path": "o"}}))
        argv = [str(spec), *argv[1:]]
    assert main(argv) == 1
    assert "127.0.0.1:9" in capsys.readouterr().err


# ---- 2. serve: one ready line once it accepts requests ----------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_prints_one_ready_line_once_it_accepts_requests(tmp_path, workers):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--state-dir", str(tmp_path / "svc"),
                             "--port", "0", "--log-level", "warning", "--workers", str(workers)],
                            cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(60)
        assert first and first[0], f"no ready line; stderr:\n{proc.stderr.read() if proc.poll() is not None else ''}"
        m = re.fullmatch(r"ready on http://127\.0\.0\.1:(\d+)\n", first[0])
        assert m, first[0]
        # no wait, no retry: the line comes once the database is migrated and the socket accepts
        assert httpx.get(f"http://127.0.0.1:{m[1]}/healthz", timeout=10).status_code == 200
        assert (tmp_path / "svc" / "tokenmill.db").exists()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert out == ""  # the one line, nothing else on stdout


# ---- 3. --version, help for every positional --------------------------------------------------------------


def test_version_comes_from_the_package_metadata(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"tokenmill {metadata.version('tokenmill')}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", metadata.version("tokenmill"))


class _Parsed(Exception):
    """Raised in place of parsing: carries the parser a command built."""


def _positionals_without_help(parser: argparse.ArgumentParser, path: str) -> list[str]:
    missing = []
    for action in parser._actions:  # argparse keeps no public list of a parser's arguments
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += _positionals_without_help(sub, f"{path} {name}")
        if action.option_strings:
            continue
        if not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{path}: {action.dest}")
    return missing


def test_every_positional_of_every_subcommand_has_help(monkeypatch):
    """Each command's own parser (every command builds its own in ``main``: caught at ``parse_args``)."""
    def capture(self, args=None, namespace=None):
        raise _Parsed(self)

    parsers = {"tokenmill": cli.build_parser()}
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    for name, (module, _) in cli.COMMANDS.items():
        with pytest.raises(_Parsed) as parsed:
            importlib.import_module(module).main([])
        parsers[f"tokenmill {name}"] = parsed.value.args[0]
    missing = [m for path, p in parsers.items() for m in _positionals_without_help(p, path)]
    assert not missing, missing
    counted = sum(1 for p in parsers.values() for a in p._actions if not a.option_strings)
    assert counted >= 10  # run's spec, inspect's output, submit's spec, the job ids, apikey's action...


#: the modules of service/commands that are not a command: what several commands share
SHARED = {"exits", "http_client", "http_command", "store_options"}


def test_each_command_is_one_module_reached_one_way():
    """``tokenmill X`` is ``COMMANDS[X]``'s ``main``, defined in that module (no module re-exporting another's);
    every module of ``service/commands`` but the shared ones is a command of the table, with its own parser and
    run function, and none is a second entry point (``python -m``) or looks a command up by name."""
    folder = ROOT / "service" / "commands"
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__"} - SHARED
    tabled = {module.rsplit(".", 1)[1] for module, _ in cli.COMMANDS.values()
              if module.startswith("service.commands.")}
    assert modules == tabled
    for name, (module, _) in cli.COMMANDS.items():
        main = cli.command_main(name)
        assert main.__module__ == module, f"tokenmill {name}: main comes from {main.__module__}"
    for name in modules:
        mod = importlib.import_module(f"service.commands.{name}")
        assert callable(mod.build_parser) and callable(mod.run), name
    sources = {p.name: p.read_text() for p in folder.glob("*.py")}
    assert not [name for name, text in sources.items() if "__main__" in text]  # reached through service.cli only
    sources["cli.py"] = (ROOT / "service" / "cli.py").read_text()
    assert not [name for name, text in sources.items() if "globals()" in text]


def test_run_help_says_what_spec_is():
    proc = _run_cli("run", "-h")
    assert proc.returncode == 0
    assert re.search(r"^\s+spec\s+the job spec file", proc.stdout, re.M), proc.stdout


# ---- 4. submit: the spec's paths sent absolute and normalised ----------------------------------------------


def test_a_spec_files_paths_resolve_against_its_folder_with_no_dotdot_left(tmp_path):
    data = tmp_path / "data"
    (data / "cli").mkdir(parents=True)
    spec = {"name": "t", "inputs": [{"path": "../raw/*.jsonl"}, {"path": "s3://bucket/../keep/*.jsonl"},
                                    {"path": "/abs/./x/../y.jsonl"}],
            "tokenizer": {"path": "../tok//tokenizer.json"},
            "stages": [{"type": "exact_dedup", "params": {"dedup_against": "./../earlier"}},
                       {"type": "decontaminate", "params": {"benchmarks": ["../b/*.jsonl", "https://h/b.jsonl"]}},
                       {"type": "quality_classifier", "params": {"model": "../m.bin"}},
                       {"type": "c4", "params": {"bad_words": "../words.txt"}},
                       {"type": "pii", "params": {"spacy_model": "../spacy"}}],
            "output": {"path": "../out"}}
    (data / "cli" / "spec.yaml").write_text(yaml.safe_dump(spec))
    base = data.resolve()
    loaded = load_spec(data / "cli" / "spec.yaml")
    assert [i.path for i in loaded.inputs] == [str(base / "raw" / "*.jsonl"), "s3://bucket/../keep/*.jsonl",
                                               "/abs/y.jsonl"]
    assert loaded.tokenizer is not None and loaded.tokenizer.path == str(base / "tok" / "tokenizer.json")
    assert loaded.output.path == str(base / "out")
    params = [loaded.stage_params(i) for i in range(5)]
    assert params[0].dedup_against == str(base / "earlier")
    assert params[1].benchmarks == [str(base / "b" / "*.jsonl"), "https://h/b.jsonl"]
    assert params[2].model == params[3].bad_words.replace("words.txt", "m.bin") == str(base / "m.bin")
    assert params[4].spacy_model == str(base / "spacy")
    # the function tokenmill run and tokenmill submit share, on the raw data
    raw = resolve_paths({"inputs": [{"path": "a/../b"}], "output": {"path": "~/o"}}, base)
    assert raw == {"inputs": [{"path": str(base / "b")}], "output": {"path": os.path.expanduser("~/o")}}


def test_dotdot_after_a_symlink_means_what_the_os_makes_of_it(tmp_path):
    """``link/..`` is the parent of the link's target (as ``open`` sees it), not the folder holding the link."""
    (tmp_path / "real" / "deep").mkdir(parents=True)
    (tmp_path / "real" / "a.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "link").symlink_to(tmp_path / "real" / "deep")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "t", "inputs": [{"path": "link/../a.jsonl"}],
                                                     "output": {"path": "out"}}))
    path = load_spec(tmp_path / "s.yaml").inputs[0].path
    assert ".." not in Path(path).parts and path == str((tmp_path / "real" / "a.jsonl").resolve())
    assert os.path.samefile(path, tmp_path / "link" / ".." / "a.jsonl")


def test_submit_sends_a_relative_dotdot_spec_the_server_accepts(tmp_path, capsys):
    """Against a live server (confined to its roots, refusing ``..``): ``inputs: [{path: ../in/*.jsonl}]``."""
    with live_api(tmp_path) as live:
        folder = live.inputs.rsplit("/in/", 1)[0] + "/cli"
        os.mkdir(folder)
        out = os.path.relpath(live.output_root / "o1", folder)
        assert ".." in out
        spec = Path(folder) / "spec.yaml"
        spec.write_text(yaml.safe_dump({"name": "rel", "inputs": [{"path": "../in/*.jsonl"}],
                                        "tokenizer": None, "output": {"path": out, "documents": "jsonl"}}))
        assert main_submit([str(spec), "--server", live.url, "--api-key", live.token, "--json"]) == 0, \
            capsys.readouterr().err
        job = json.loads(capsys.readouterr().out)
        assert job["output_path"] == os.path.realpath(live.output_root / "o1")


# ---- 5. one round: the schema's problems and the file checks of what could be read ------------------------


def _one_round_spec(folder: Path) -> dict:
    return {"name": "t", "inputs": [{"path": str(folder / "nothing" / "*.jsonl")}],
            "stages": [{"type": "normalize"}, {"type": "no_such_stage"}],
            "tokenizer": {"path": str(folder / "no_tokenizer.json")}, "output": {"path": str(folder / "out")}}


def test_schema_and_file_problems_come_in_one_round(tmp_path):
    with pytest.raises(SpecError) as err:
        checked(_one_round_spec(tmp_path))
    assert [(p.loc, p.kind) for p in err.value.problems] == [
        (("stages", 1, "type"), "unknown_stage"), (("inputs", 0, "path"), NO_MATCH),
        (("tokenizer", "path"), "preflight")]
    # a part that fails its own schema gets no file check (its schema problem is the one to fix)
    data = _one_round_spec(tmp_path) | {"inputs": [{"path": str(tmp_path / "x" / "*.jsonl"), "format": "nope"}]}
    with pytest.raises(SpecError) as err:
        checked(data)
    assert [p.loc for p in err.value.problems] == [("inputs", 0, "format"), ("stages", 1, "type"),
                                                   ("tokenizer", "path")]


def test_cli_reports_an_unknown_stage_and_an_input_matching_nothing_in_one_run(tmp_path):
    (tmp_path / "s.yaml").write_text("name: t\n"
                                     "inputs:\n"
                                     "  - path: nothing/*.jsonl\n"
                                     "stages:\n"
                                     "  - type: normalize\n"
                                     "  - type: no_such_stage\n"
                                     "output: {path: out}\n")
    proc = _run_cli("run", str(tmp_path / "s.yaml"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("error: stages.1.type (line 6): unknown stage 'no_such_stage' (known: c4, ")
    assert lines[1] == f"error: inputs.0.path (line 3): no file matches {str(tmp_path / 'nothing' / '*.jsonl')!r}"


# ---- 6. YAML: a syntax error's line and column, a field's line --------------------------------------------


def test_yaml_syntax_error_gives_line_and_column(tmp_path):
    (tmp_path / "spec.yaml").write_text("name: t\ninputs:\n  - path: a.jsonl\nkey: a: b\n")
    proc = _run_cli("run", "spec.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == "error: spec.yaml:4:7: mapping values are not allowed here\n"


def test_json_syntax_error_gives_line_and_column(tmp_path):
    (tmp_path / "spec.json").write_text('{"name": "t",\n "inputs": ]}\n')
    with pytest.raises(SpecError) as err:
        load_checked(tmp_path / "spec.json")
    assert str(err.value) == f"{tmp_path / 'spec.json'}:2:12: Expecting value"


def test_a_fields_problem_names_its_yaml_line(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "s.yaml").write_text("name: t\ninputs:\n  - path: in.jsonl\npacking:\n  seq_len: 0\n"
                                     "output: {}\n")
    with pytest.raises(SpecError) as err:
        load_checked(tmp_path / "s.yaml")
    # a missing field is shown at the line of the mapping it is missing from
    assert str(err.value).splitlines() == ["packing.seq_len (line 5): Input should be greater than 0",
                                           "output.path (line 6): Field required"]


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """``tokenmill inspect OUT | head``: stdout's reader is gone before the command writes; the command stops with a
    shell's SIGPIPE code (141) and no traceback, neither its own nor the interpreter's at exit."""
    from pipeline.output.shard_set import write_shard_set
    from training.synthetic import SYNTHETIC, random_packed

    out = tmp_path / "set"
    write_shard_set(out, random_packed(30, 64, 500), seq_len=64, vocab_size=500, samples_per_shard=10, **SYNTHETIC)
    read, write = os.pipe()
    os.close(read)  # the reader has already gone: the first write fails with EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "service.cli", "inspect", str(out)], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert _run_cli("inspect", str(out)).stdout.count("OK") >= 1  # with a reader, it prints as before
