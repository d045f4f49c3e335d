"""Annotate, report, filter: the language and quality filters end to end on a real local Ray (issue 10).

One job runs ``lid`` and the Gopher / FineWeb / C4 rules in annotate mode (nothing dropped, every verdict in
``meta.filters``); ``tokenmill report`` predicts what a filter-mode run drops per rule; the same job in filter
mode drops exactly that; and a third job that reads the annotated documents back (``format: documents``) and
runs ``stored_filters`` drops the same documents without recomputing a score.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from pipeline.filters.report import main as report_main
from pipeline.job.engine import run_job
from pipeline.spec import parse_spec
from tests.corpus_fixtures import make_text, write_jsonl

pytestmark = pytest.mark.ray

GERMAN = ("der die das und ist nicht ein eine mit auf für von zu den dem im sich auch es wird wurde sind "
          "haben Haus Stadt Zeit Jahr Arbeit Wasser Straße schnell langsam gestern heute morgen immer").split()
LOREM = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore."


def _german(rng: random.Random, n: int) -> str:
    words = [rng.choice(GERMAN) for _ in range(n)]
    return " ".join(" ".join(words[i:i + 10]).capitalize() + "." for i in range(0, n, 10))


def _corpus(path: Path) -> None:
    rng = random.Random(4)
    docs = []
    for i in range(240):
        kind = i % 8
        if kind == 0:
            text = _german(rng, 150)                                        # lid:language
        elif kind == 1:
            text = make_text(rng, 20)                                       # gopher_quality:word_count
        elif kind == 2:
            line = make_text(rng, 12)
            text = "\n".join([line] * 12 + [make_text(rng, 60)])           # gopher_repetition
        elif kind == 3:
            text = "\n".join(make_text(rng, 14).replace(".", "") for _ in range(12))  # fineweb: no line ends
        elif kind == 4:
            text = make_text(rng, 150) + "\n" + LOREM                       # c4:lorem_ipsum
        else:
            text = "\n".join(make_text(rng, rng.randint(40, 80)) for _ in range(4))  # kept
        docs.append({"id": f"d{i}", "text": text})
    write_jsonl(path, docs)


STAGES = ["lid", "gopher_quality", "gopher_repetition", "fineweb", "c4"]  # c4 edits text: last


def _job(tmp: Path, name: str, mode: str | None, inputs: list[dict], stages: list[dict] | None = None) -> Path:
    out = tmp / name
    if stages is None:
        stages = [{"type": t, "params": {"mode": mode, **({"languages": ["en"]} if t == "lid" else {})}}
                  for t in STAGES]
    run_job(parse_spec({
        "name": name, "inputs": inputs, "stages": stages, "tokenizer": None,
        "output": {"path": str(out), "documents": "parquet"}, "execution": {"batch_size": 32, "parallelism": 2},
    }))
    return out


def _drops(out: Path) -> Counter:
    stats = json.loads((out / "stats.json").read_text())
    return Counter({r: n for s in stats["stages"] for r, n in s["dropped"].items()})


def _kept_ids(out: Path) -> list[str]:
    import pyarrow.parquet as pq

    return [i for f in sorted((out / "documents").glob("part-*.parquet")) for i in pq.read_table(f)["id"].to_pylist()]


def test_annotate_report_then_filter_drop_what_was_predicted(ray_shared, tmp_path, capsys):
    _corpus(tmp_path / "in.jsonl")
    inputs = [{"path": str(tmp_path / "in.jsonl")}]
    annotated = _job(tmp_path, "annotate", "annotate", inputs)
    assert not _drops(annotated) and len(_kept_ids(annotated)) == 240

    assert report_main([str(annotated), "--json", "--examples", "1"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    predicted = Counter({r: v["in_order"] for fr in report["filters"].values() for r, v in fr["reasons"].items()
                         if v["in_order"]})
    families = {r.split(":")[0] for r in predicted}
    assert families == set(STAGES), predicted  # every filter fires, so a wrong prediction cannot pass

    filtered = _job(tmp_path, "filter", "filter", inputs)
    assert _drops(filtered) == predicted
    assert len(_kept_ids(filtered)) == report["kept_in_order"]

    stored = _job(tmp_path, "stored", None, [{"path": str(annotated / "documents" / "*.parquet"),
                                              "format": "documents"}], [{"type": "stored_filters"}])
    assert _drops(stored) == predicted
    assert _kept_ids(stored) == _kept_ids(filtered)
