"""exact_dedup and near_dedup on a real local Ray: what is removed, what is kept, and why."""

from __future__ import annotations

import glob
import json
import random
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from kernels.minhash import MinHasher
from pipeline.dedup.exact import ExactDedup, ExactDedupParams
from pipeline.dedup.index import DedupIndexError
from pipeline.dedup.near import NearDedup, NearDedupParams
from pipeline.stages.base import StageContext

pytestmark = pytest.mark.ray

VOCAB = [f"w{i}" for i in range(5000)]


def doc(file_index: int, record: int, text: str, doc_id: str | None = None) -> dict[str, Any]:
    return {"id": doc_id or f"f{file_index}-{record}", "text": text, "source": f"file{file_index}.jsonl",
            "ord": (file_index << 40) | record, "meta": "{}"}


def random_text(rng: random.Random, words: int = 300) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(words))


def edit(rng: random.Random, text: str, rate: float) -> str:
    """Replace a ``rate`` share of the words (chosen at random) by random words."""
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, round(rate * len(words)))):
        words[i] = rng.choice(VOCAB)
    return " ".join(words)


def jaccard(a: str, b: str) -> float:
    mh = MinHasher()
    x, y = set(mh.shingles(a)), set(mh.shingles(b))
    return len(x & y) / len(x | y)


def run_stage(ray: Any, stage: Any, rows: list[dict[str, Any]], tmp: Path, blocks: int = 4, in_order: bool = True
              ) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """Apply a DatasetStage to rows; return kept rows (in output order), its stats and its rejects."""
    from pipeline.job.stats import StageRecorder, StatsActor

    if in_order:
        rows = sorted(rows, key=lambda r: r["ord"])
    ds = ray.data.from_items(rows).repartition(blocks)
    actor = StatsActor.remote()
    recorder = StageRecorder(stage.name, actor, str(tmp / "rejected"))
    kept = list(stage.apply(ds, recorder).iter_rows())
    stats = ray.get(actor.snapshot.remote()).get(stage.name, {})
    rejected = [json.loads(line) for f in sorted(glob.glob(str(tmp / "rejected" / stage.name / "*.jsonl")))
                for line in open(f, encoding="utf-8")]
    return kept, stats, rejected


def ctx(output_dir: Path | str) -> StageContext:
    return StageContext(job_name="t", output_dir=str(output_dir), stage_index=0, work_dir=str(output_dir))


# ---- exact --------------------------------------------------------------------------------------

def test_exact_duplicates_across_input_files(ray_local: Any, tmp_path: Path) -> None:
    rng = random.Random(1)
    texts = [random_text(rng, 50) for _ in range(30)]
    rows = [doc(0, i, t) for i, t in enumerate(texts)]
    # file 1 repeats three of them: verbatim, with other whitespace, and in decomposed Unicode
    rows.append(doc(1, 0, texts[3]))
    rows.append(doc(1, 1, "  " + texts[7].replace(" ", " \n\t ", 5) + "\n"))
    rows.append(doc(1, 2, unicodedata.normalize("NFD", texts[9] + " café")))
    rows.append(doc(0, 30, texts[9] + " café"))
    rows.append(doc(1, 3, texts[11].upper()))  # differs by case: kept unless casefold
    kept, stats, rejected = run_stage(ray_local, ExactDedup(ExactDedupParams(), ctx(tmp_path)), rows, tmp_path)

    kept_ids = {r["id"] for r in kept}
    assert len(kept) == 32
    assert {"f1-0", "f1-1", "f1-2"}.isdisjoint(kept_ids)
    assert {"f0-3", "f0-7", "f0-30", "f1-3"} <= kept_ids
    by_id = {r["id"]: r for r in rejected}
    assert set(by_id) == {"f1-0", "f1-1", "f1-2"}
    assert by_id["f1-0"]["reason"] == "exact_duplicate"
    assert by_id["f1-0"]["kept_id"] == "f0-3" and by_id["f1-0"]["detail"] == {}
    assert by_id["f1-1"]["kept_id"] == "f0-7"
    assert by_id["f1-2"]["kept_id"] == "f0-30"  # smallest ord wins, not the first file read
    assert by_id["f1-2"]["text"] == rows[-3]["text"]  # the rejected document is written as it was
    assert stats["docs_in"] == 35 and stats["docs_out"] == 32
    assert stats["dropped"] == {"exact_duplicate": 3}
    assert [r["ord"] for r in kept] == sorted(r["ord"] for r in kept)  # order kept: no re-sort needed

    folded, _, _ = run_stage(ray_local, ExactDedup(ExactDedupParams(casefold=True), ctx("")), rows,
                             tmp_path / "cf")
    assert "f1-3" not in {r["id"] for r in folded} and len(folded) == 31


def test_exact_dedup_against_a_published_output(ray_local: Any, tmp_path: Path) -> None:
    rng = random.Random(2)
    old_texts = [random_text(rng, 40) for _ in range(20)]
    first = tmp_path / "first"
    kept, _, _ = run_stage(ray_local, ExactDedup(ExactDedupParams(), ctx(first)),
                           [doc(0, i, t) for i, t in enumerate(old_texts)], first)
    assert len(kept) == 20
    assert (first / "index" / "exact_dedup" / "meta.json").is_file()

    fresh = [random_text(rng, 40) for _ in range(5)]
    rows = [doc(0, 0, old_texts[4]), doc(0, 1, fresh[0]), doc(0, 2, fresh[0]), doc(1, 0, old_texts[4]),
            doc(1, 1, fresh[1])]
    second = tmp_path / "second"
    stage = ExactDedup(ExactDedupParams(dedup_against=str(first)), ctx(second))
    kept, stats, rejected = run_stage(ray_local, stage, rows, second)
    assert sorted(r["id"] for r in kept) == ["f0-1", "f1-1"]
    reasons = {r["id"]: (r["reason"], r["kept_id"]) for r in rejected}
    assert reasons == {
        "f0-0": ("exact_duplicate_of_published", "f0-4"),
        "f1-0": ("exact_duplicate_of_published", "f0-4"),
        "f0-2": ("exact_duplicate", "f0-1"),
    }
    with pytest.raises(DedupIndexError, match="casefold"):
        ExactDedup(ExactDedupParams(casefold=True, dedup_against=str(first)), ctx("")).apply(None, None)
    with pytest.raises(DedupIndexError, match="no exact_dedup index"):
        ExactDedup(ExactDedupParams(dedup_against=str(tmp_path / "nothing")), ctx("")).apply(None, None)


# ---- near ---------------------------------------------------------------------------------------

def planted_corpus(seed: int = 3) -> tuple[list[dict[str, Any]], dict[str, str], set[str]]:
    """Unrelated base documents, close variants (1-1.5% of words replaced: J >= 0.8) that must go,
    and far variants (30% replaced) that must stay. Returns rows, {variant id: base id}, far ids."""
    rng = random.Random(seed)
    rows, close, far = [], {}, set()
    for i in range(40):
        base = random_text(rng)
        rows.append(doc(0, i, base, f"base{i}"))
        if i % 2 == 0:
            for k, rate in enumerate((0.01, 0.015)):
                vid = f"near{i}-{k}"
                text = edit(rng, base, rate)
                assert jaccard(base, text) >= 0.8
                rows.append(doc(1 + k, i, text, vid))
                close[vid] = f"base{i}"
        if i % 5 == 0:
            text = edit(rng, base, 0.3)
            assert jaccard(base, text) < 0.4
            rows.append(doc(3, i, text, f"far{i}"))
            far.add(f"far{i}")
    return rows, close, far


def test_planted_near_duplicates_are_removed_and_nothing_else(ray_local: Any, tmp_path: Path) -> None:
    rows, close, far = planted_corpus()
    stage = NearDedup(NearDedupParams(threshold=0.7), ctx(tmp_path))
    kept, stats, rejected = run_stage(ray_local, stage, rows, tmp_path)
    kept_ids = {r["id"] for r in kept}
    assert kept_ids == {r["id"] for r in rows} - set(close)
    assert far <= kept_ids and {f"base{i}" for i in range(40)} <= kept_ids
    assert {r["id"]: r["kept_id"] for r in rejected} == close
    assert {r["reason"] for r in rejected} == {"near_duplicate"}
    assert stats["dropped"] == {"near_duplicate": len(close)}
    assert stats["docs_in"] == len(rows) and stats["docs_out"] == len(kept)
    meta = json.loads((tmp_path / "index" / "near_dedup" / "meta.json").read_text())
    assert meta["rows"]["docs"] == len(kept)


@pytest.mark.parametrize("params", [{"verify": False}, {"shingle": "char", "ngram": 9},
                                    {"hashfunc": "sha1", "bands": 16, "rows": 8}])
def test_near_dedup_variants(ray_local: Any, tmp_path: Path, params: dict[str, Any]) -> None:
    rows, close, far = planted_corpus(seed=5)
    stage = NearDedup(NearDedupParams(threshold=0.7, write_index=False, **params), ctx(tmp_path))
    kept, _, _ = run_stage(ray_local, stage, rows, tmp_path)
    kept_ids = {r["id"] for r in kept}
    assert kept_ids.isdisjoint(close)
    assert far <= kept_ids and {f"base{i}" for i in range(40)} <= kept_ids


def chained_corpus() -> list[dict[str, Any]]:
    """Chains of gradual edits (each step close to the previous one, the ends far apart) whose
    documents are scattered over files, so that the kept one is decided by ord, not by position."""
    rng = random.Random(9)
    rows = []
    for c in range(12):
        text = random_text(rng, 200)
        for step in range(6):
            rows.append(doc(rng.randrange(4), c * 10 + step, text, f"c{c}-{step}"))
            text = edit(rng, text, 0.01)
    return rows


def test_kept_set_is_the_same_on_every_run(ray_local: Any, tmp_path: Path) -> None:
    rows = chained_corpus()
    results = []
    for parts, blocks in ((1, 1), (3, 5), (8, 2), (3, 5)):
        stage = NearDedup(NearDedupParams(threshold=0.7, partitions=parts, write_index=False), ctx(""))
        kept, _, rejected = run_stage(ray_local, stage, rows, tmp_path / f"{parts}-{blocks}", blocks=blocks)
        results.append(({r["id"] for r in kept}, {r["id"]: r["kept_id"] for r in rejected}))
    assert all(r == results[0] for r in results)
    kept_ids, clusters = results[0]
    # one document per chain survives: the one with the smallest ord
    assert len(kept_ids) == 12
    by_chain: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_chain.setdefault(r["id"].split("-")[0], []).append(r)
    assert kept_ids == {min(ch, key=lambda r: r["ord"])["id"] for ch in by_chain.values()}
    assert all(clusters[i] in kept_ids and clusters[i].split("-")[0] == i.split("-")[0] for i in clusters)


def test_input_out_of_ord_order_gives_the_same_result(ray_local: Any, tmp_path: Path) -> None:
    rows = chained_corpus()
    stage = NearDedup(NearDedupParams(threshold=0.7, write_index=False), ctx(""))
    ordered, _, _ = run_stage(ray_local, stage, rows, tmp_path / "a")
    shuffled = random.Random(0).sample(rows, len(rows))
    kept, _, _ = run_stage(ray_local, stage, shuffled, tmp_path / "b", blocks=3, in_order=False)
    assert [r["id"] for r in kept] == [r["id"] for r in ordered]  # sorted by ord on the way


def test_near_dedup_against_a_published_output(ray_local: Any, tmp_path: Path) -> None:
    rng = random.Random(11)
    old = [random_text(rng) for _ in range(15)]
    first = tmp_path / "first"
    run_stage(ray_local, NearDedup(NearDedupParams(threshold=0.7), ctx(first)),
              [doc(0, i, t, f"old{i}") for i, t in enumerate(old)], first)

    d1 = edit(rng, old[2], 0.01)  # close to a published document
    d2 = edit(rng, d1, 0.01)  # close to d1 only: goes with it, transitively
    fresh = random_text(rng)
    rows = [doc(0, 0, d1, "d1"), doc(0, 1, fresh, "fresh"), doc(1, 0, d2, "d2"),
            doc(1, 1, edit(rng, fresh, 0.01), "fresh-copy"), doc(1, 2, random_text(rng), "other")]
    second = tmp_path / "second"
    stage = NearDedup(NearDedupParams(threshold=0.7, dedup_against=[str(first)]), ctx(second))
    kept, stats, rejected = run_stage(ray_local, stage, rows, second)
    assert sorted(r["id"] for r in kept) == ["fresh", "other"]
    got = {r["id"]: (r["reason"], r["kept_id"]) for r in rejected}
    assert got == {
        "d1": ("near_duplicate_of_published", "old2"),
        "d2": ("near_duplicate_of_published", "old2"),
        "fresh-copy": ("near_duplicate", "fresh"),
    }
    # the second job's index holds only what it published; a third job checks against both
    third = tmp_path / "third"
    stage = NearDedup(NearDedupParams(threshold=0.7, dedup_against=[str(first), str(second)]), ctx(third))
    kept, _, rejected = run_stage(ray_local, stage, [doc(0, 0, edit(rng, fresh, 0.01), "again"),
                                                     doc(0, 1, old[5], "old5-again")], third)
    assert kept == []
    assert {r["id"]: r["kept_id"] for r in rejected} == {"again": "fresh", "old5-again": "old5"}

    with pytest.raises(DedupIndexError, match="num_perm"):
        NearDedup(NearDedupParams(threshold=0.7, num_perm=64, dedup_against=str(first)), ctx("")).apply(None, None)


def test_refresh_from_a_spec_file_with_a_relative_dedup_against(ray_local: Any, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``dedup_against: ../earlier_out`` in a spec file means next to the spec's folder, whatever the
    working directory: the spec loads (its preflight finds both indexes) and the refresh drops repeats."""
    import yaml

    from pipeline.spec import load_spec

    rng = random.Random(4)
    old = [random_text(rng, 60) for _ in range(8)]
    earlier = tmp_path / "runs" / "earlier_out"
    rows = [doc(0, i, t, f"old{i}") for i, t in enumerate(old)]
    run_stage(ray_local, ExactDedup(ExactDedupParams(), ctx(earlier)), rows, tmp_path / "r1")
    run_stage(ray_local, NearDedup(NearDedupParams(threshold=0.7), ctx(earlier)), rows, tmp_path / "r2")
    specs = tmp_path / "runs" / "specs"
    specs.mkdir()
    (specs / "new.jsonl").write_text('{"text": "new"}\n')
    (specs / "refresh.yaml").write_text(yaml.safe_dump({
        "name": "refresh", "inputs": [{"path": "new.jsonl"}], "output": {"path": "../refresh_out"},
        "stages": [{"type": "exact_dedup", "params": {"dedup_against": "../earlier_out"}},
                   {"type": "near_dedup", "params": {"threshold": 0.7, "dedup_against": ["../earlier_out"]}}],
    }))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")

    spec = load_spec(Path("..") / "runs" / "specs" / "refresh.yaml")
    assert Path(spec.stage_params(0).dedup_against).resolve() == earlier.resolve()
    assert [Path(p).resolve() for p in spec.stage_params(1).dedup_against] == [earlier.resolve()]
    out = Path(spec.output.path)
    stage = ExactDedup(spec.stage_params(0), ctx(out))
    kept, _, rejected = run_stage(ray_local, stage, [doc(0, 0, old[3], "again"), doc(0, 1, random_text(rng), "new")],
                                  out)
    assert [r["id"] for r in kept] == ["new"]
    assert {r["id"]: (r["reason"], r["kept_id"]) for r in rejected} == {
        "again": ("exact_duplicate_of_published", "old3")}


def test_documents_without_words_are_never_matched(ray_local: Any, tmp_path: Path) -> None:
    rows = [doc(0, i, t) for i, t in enumerate(["...", "!!!", "--", "", "   "])]
    kept, stats, _ = run_stage(ray_local, NearDedup(NearDedupParams(write_index=False), ctx("")), rows, tmp_path)
    assert len(kept) == 5 and stats["dropped"] == {}


def test_bad_params_are_refused() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="both bands and rows"):
        NearDedupParams(bands=4)
    with pytest.raises(ValidationError, match="exceeds num_perm"):
        NearDedupParams(bands=20, rows=10)
    with pytest.raises(ValidationError):
        NearDedupParams(threshold=1.5)
    with pytest.raises(ValidationError):
        ExactDedupParams(casefold=True, unknown=1)
