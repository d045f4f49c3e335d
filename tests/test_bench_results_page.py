"""bench/RESULTS.md is what ``python -m bench.results_page`` makes of bench/results/*.json, and that folder holds
one file per bench and kind of machine, each recording the machine, the date, the command and its figures."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import pytest

from bench import common, results_page

NAME = re.compile(r"(?P<bench>[a-z][a-z0-9_]*?)_(?P<machine>\d+cpu|[a-z]\d+)\.json")
FILES = sorted(common.RESULTS.glob("*"))


def test_the_page_is_what_the_result_files_give():
    assert results_page.PAGE.read_text(encoding="utf-8") == results_page.render(), (
        "bench/RESULTS.md is stale: run python -m bench.results_page")


def test_a_changed_result_changes_the_page(tmp_path: Path):
    for path in FILES:
        (tmp_path / path.name).write_bytes(path.read_bytes())
    target = tmp_path / "scale_2cpu.json"
    rec = json.loads(target.read_text())
    rec["figures"]["core_hours_per_tb"] = 1.5
    target.write_text(json.dumps(rec))
    assert results_page.render(tmp_path) != results_page.render()
    assert "| core_hours_per_tb | 1.5 |" in results_page.render(tmp_path)


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_one_file_per_bench_named_after_its_script(path: Path):
    m = NAME.fullmatch(path.name)
    assert m, f"{path.name}: not <bench>_<machine>.json (no dates or letters: history is in git)"
    bench = m["bench"]
    assert any((common.REPO / "bench" / f"{bench}{ext}").exists() for ext in (".py", ".sh")), (
        f"{path.name}: no bench/{bench}.py or .sh")
    assert json.loads(path.read_text())["bench"] == bench


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_result_records_machine_date_command_and_figures(path: Path):
    rec = json.loads(path.read_text())
    for label, run in {"latest": rec, **rec.get("variants", {})}.items():
        missing = [f for f in common.RECORD_FIELDS if not run.get(f)]
        assert not missing, f"{path.name} ({label}): no {', '.join(missing)}"
        assert isinstance(run["machine"], dict) and isinstance(run["figures"], dict)
        datetime.date.fromisoformat(run["date"])
        assert all(v is None or isinstance(v, (bool, int, float, str)) for v in run["figures"].values())


def test_the_name_rule_refuses_dated_and_lettered_copies():
    for bad in ("scale_2cpu_2026-12-06a.json", "scale_2cpu_b.json", "curate_vs_datatrove_2cpu_2026-12-04.json",
                "scale_2cpu_0.25gb_rejected_all.json", "gpu_train_125m_h200.jsonl"):
        assert not NAME.fullmatch(bad), bad
    assert NAME.fullmatch("curate_vs_datatrove_2cpu.json")["bench"] == "curate_vs_datatrove"
    assert NAME.fullmatch("gpu_check_h200.json")["machine"] == "h200"


def test_emit_json_replaces_the_headline_run_and_keeps_variants(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr("sys.argv", [str(common.REPO / "bench" / "scale.py"), "--sizes", "0.25"])
    first = common.emit_json({"bench": "scale", "x": 1})
    common.emit_json({"bench": "scale", "x": 2, "nested": {"y": [3, 1, 2]}}, variant="other")
    again = common.emit_json({"bench": "scale", "x": 3})
    assert first == again == tmp_path / f"scale_{common.machine_tag(common.machine())}.json"
    rec = json.loads(again.read_text())
    assert rec["figures"] == {"x": 3} and rec["command"].endswith("bench/scale.py --sizes 0.25")
    assert rec["variants"]["other"]["figures"] == {"x": 2, "nested.y": "1-3 over 3 runs"}
    assert capsys.readouterr().out.splitlines()[-1] == '{"bench": "scale", "x": 3}'
