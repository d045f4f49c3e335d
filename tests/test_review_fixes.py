"""Regressions found in review: each was a traceback, a silent corruption or a lost file."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.documents import Drop
from pipeline.packing import BestFitPacker
from pipeline.preflight import checked
from pipeline.readers import read_file
from pipeline.spec import InputSpec, SpecError, TokenizerSpec, parse_spec


def _spec(tmp_path, **over):
    (tmp_path / "in.jsonl").write_text('{"text": "hello world"}\n')
    spec = {"name": "t", "inputs": [{"path": str(tmp_path / "in.jsonl")}], "output": {"path": str(tmp_path / "out")}}
    spec.update(over)
    return spec


def test_huge_integer_is_bad_json_not_a_crash(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "n", "n": ' + "9" * 5000 + "}\n")
    items = list(read_file(0, str(path), InputSpec(path=str(path))))
    assert [i.reason for i in items if isinstance(i, Drop)] == ["bad_json"]
    assert [i["text"] for i in items if not isinstance(i, Drop)] == ["ok"]


def test_parquet_value_python_cannot_hold_costs_only_its_row(tmp_path):
    path = tmp_path / "x.parquet"
    table = pa.table({"text": ["a", "b", "c"], "ts": pa.array([0, 4 * 10**17, 0], pa.timestamp("us"))})
    pq.write_table(table, path)
    items = list(read_file(0, str(path), InputSpec(path=str(path))))
    assert [i.reason if isinstance(i, Drop) else i["text"] for i in items] == ["a", "bad_record:unconvertible", "c"]


def test_sparse_vocab_gets_a_wide_dtype_and_never_wraps():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    from pipeline.shard_format import token_dtype
    from pipeline.tokenize import TokenizerInfo

    tok = Tokenizer(WordLevel({"a": 0, "b": 1, "<|endoftext|>": 70000}, unk_token="a"))
    info = TokenizerInfo.resolve(tok, TokenizerSpec())
    assert info.vocab_size == 70001 and token_dtype(info.vocab_size) == np.uint32
    seq = next(iter(BestFitPacker(4).add("d", np.array([1, 2, 70000, 5], np.int32))))
    with pytest.raises(ValueError, match="does not fit"):
        seq.arrays(np.dtype(np.uint16))


@pytest.mark.parametrize(
    "over, start",
    [
        ({"stages": [{"type": "normalize", "params": {"form": "NFX"}}]}, "stages.0.params.form:"),
        ({"stages": [{"type": "exact_dedup", "params": {"dedup_against": "/nonexistent/out"}}]},
         "stages.0.params.dedup_against:"),
        ({"stages": [{"type": "near_dedup", "params": {"dedup_against": ["/nonexistent/out"]}}]},
         "stages.0.params.dedup_against:"),
    ],
)
def test_refused_at_spec_time(tmp_path, over, start):
    with pytest.raises(SpecError) as err:
        checked(_spec(tmp_path, **over))
    assert str(err.value).startswith(start), str(err.value)


def test_cli_flag_gets_the_fields_checks(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_spec(tmp_path)))
    proc = subprocess.run([sys.executable, "-m", "service.cli", "run", str(path), "--parallelism", "-1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "error: execution.parallelism:" in proc.stderr and "Traceback" not in proc.stderr


def test_foreign_files_in_output_are_not_deleted(tmp_path):
    from pipeline.job.engine import Job
    from pipeline.job.errors import JobError

    out = tmp_path / "out"
    out.mkdir()
    (out / "tokenizer.json").write_text("{}")
    spec = parse_spec(_spec(tmp_path))
    with pytest.raises(JobError, match="not written by tokenmill") as err:
        Job(spec).run()
    assert err.value.category == "validation"
    assert (out / "tokenizer.json").read_text() == "{}" and sorted(p.name for p in out.iterdir()) == ["tokenizer.json"]


def test_malformed_manifest_is_a_clear_error(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 1}))
    proc = subprocess.run([sys.executable, "-m", "service.cli", "inspect", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "malformed manifest" in proc.stderr and "Traceback" not in proc.stderr


def test_ray_started_elsewhere_still_gets_ordered_output(ray_shared):
    from ray.data import DataContext

    from pipeline.job.ray_env import init_ray

    DataContext.get_current().execution_options.preserve_order = False
    assert init_ray() is False
    assert DataContext.get_current().execution_options.preserve_order is True
