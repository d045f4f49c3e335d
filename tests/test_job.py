"""End to end on a real local Ray: determinism, round trip, bad input, inspect."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import unicodedata
import zlib
from pathlib import Path

import pytest

from pipeline.job.engine import run_job
from pipeline.job.errors import JobError
from pipeline.job.stats import in_reject_sample
from pipeline.output.inspect import decode_documents, verify_shards
from pipeline.shard_format import Manifest
from pipeline.spec import parse_spec
from tests.corpus_fixtures import clean_corpus, make_text, write_jsonl

pytestmark = pytest.mark.ray


def _spec(source: str, out: Path, **over):
    spec = {
        "name": "t",
        "inputs": [{"path": source}],
        "stages": [{"type": "normalize"}],
        "tokenizer": {"train": {"vocab_size": 400, "sample_docs": 500}},
        "packing": {"seq_len": 128},
        "output": {"path": str(out), "samples_per_shard": 16},
        "execution": {"batch_size": 32},
    }
    spec.update(over)
    return parse_spec(spec)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    return folder, clean_corpus(folder, 300)


@pytest.fixture(scope="module")
def first_run(ray_local, corpus, tmp_path_factory):
    folder, _ = corpus
    out = tmp_path_factory.mktemp("run1")
    return run_job(_spec(str(folder), out, execution={"batch_size": 32, "parallelism": 1}))


def test_shards_follow_the_contract(first_run):
    m = Manifest.load(first_run.output_dir)
    assert m.dtype == "uint16" and m.seq_len == 128 and m.eos_id is not None and m.bos_id is None
    assert all(s.samples == 16 for s in m.shards[:-1]) and m.shards[-1].samples <= 16
    assert [s.partial for s in m.shards] == [False] * (len(m.shards) - 1) + [m.shards[-1].samples < 16]
    assert all(c.ok for c in verify_shards(first_run.output_dir))
    assert (first_run.output_dir / "tokenizer.json").exists()
    stats = json.loads((first_run.output_dir / "stats.json").read_text())
    assert [s["stage"] for s in stats["stages"]] == ["00-read", "01-normalize", "90-tokenize"]
    assert stats["stages"][0]["docs_out"] == 300


def test_round_trip_every_document(first_run, corpus, tmp_path):
    """`tokenmill inspect --export-docs` gives back exactly the (normalized) text of every document."""
    _, docs = corpus
    export = tmp_path / "docs.jsonl"
    cmd = [sys.executable, "-m", "service.cli", "inspect", str(first_run.output_dir), "--export-docs", str(export)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    back = [json.loads(line) for line in export.read_text().splitlines()]
    assert len(back) == len(docs)
    assert [b["text"] for b in back] == [unicodedata.normalize("NFC", d["text"]).strip() for d in docs]
    assert {b["ord"]: b["text"] for b in back} == decode_documents(first_run.output_dir)


def test_parallelism_and_reruns_give_identical_shards(first_run, corpus, tmp_path):
    folder, _ = corpus
    again = run_job(_spec(str(folder), tmp_path / "p1", execution={"batch_size": 32, "parallelism": 1}))
    par2 = run_job(_spec(str(folder), tmp_path / "p2", execution={"batch_size": 7, "parallelism": 2}))
    ref = [s.sha256 for s in first_run.manifest.shards]
    assert [s.sha256 for s in again.manifest.shards] == ref
    assert [s.sha256 for s in par2.manifest.shards] == ref
    assert again.manifest.to_json() == first_run.manifest.to_json()
    # the dataset card and its figures: the same bytes from two runs of the spec (into two folders)
    card = sorted(p.relative_to(first_run.output_dir) for p in [first_run.output_dir / "README.md",
                                                                 *(first_run.output_dir / "card").iterdir()])
    assert len(card) >= 6 and Path("card/spec.yaml") in card
    assert sorted(p.relative_to(again.output_dir) for p in [again.output_dir / "README.md",
                                                             *(again.output_dir / "card").iterdir()]) == card
    for name in card:
        assert (first_run.output_dir / name).read_bytes() == (again.output_dir / name).read_bytes(), name


def test_existing_output_is_refused(first_run, corpus):
    folder, _ = corpus
    with pytest.raises(JobError, match="output.path"):
        run_job(_spec(str(folder), first_run.output_dir))


def test_bad_input_is_counted_and_every_valid_document_kept(ray_local, tmp_path):
    import random

    rng = random.Random(7)
    folder = tmp_path / "bad"
    folder.mkdir()
    good = [{"id": f"g{i}", "text": make_text(rng, 40)} for i in range(20)]
    big = {"id": "big", "text": make_text(rng, 900_000)[: 5 * 1024 * 1024]}
    lines = [json.dumps(d).encode() for d in good[:10]]
    lines += [b'{"id": "broken", "text": "no end', b"\xff\xfe not utf8 \xc3\x28", b'{"id": "e", "text": "   "}',
              b'{"id": "nt"}', b"[1, 2]", json.dumps(big).encode()]
    (folder / "mixed.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    full = gzip.compress("".join(json.dumps(d) + "\n" for d in good[10:]).encode(), mtime=0)
    # a truncated .gz: the first documents are readable, then the stream ends early
    cut = full[: int(len(full) * 0.7)]
    (folder / "cut.jsonl.gz").write_bytes(cut)
    salvageable = zlib.decompressobj(31).decompress(cut).count(b"\n")  # complete lines before the cut
    assert 0 < salvageable < 10
    # exact copies after everything else (path order): exact_dedup drops each, and output.rejected_sample writes
    # the share of them its id hash picks, while the reader's malformed records are all written
    copies = [{"id": f"copy{i}", "text": good[i % 10]["text"]} for i in range(60)]
    write_jsonl(folder / "z-copies.jsonl", copies)
    result = run_job(_spec(str(folder), tmp_path / "out", packing={"seq_len": 1024},
                           stages=[{"type": "normalize"}, {"type": "exact_dedup"}],
                           output={"path": str(tmp_path / "out"), "samples_per_shard": 16, "rejected_sample": 0.3}))
    read = result.stats["stages"][0]
    assert read["dropped"]["bad_json"] == 1
    assert read["dropped"]["invalid_utf8"] == 1
    assert read["dropped"]["empty_text"] == 1
    assert read["dropped"]["missing_text"] == 1
    assert read["dropped"]["not_an_object"] == 1
    assert read["dropped"]["truncated_file"] == 1
    readable = read["docs_out"] - len(copies)
    assert readable == 10 + 1 + salvageable  # good lines + the 5 MB document + what precedes the cut
    assert result.stats["stages"][2]["dropped"] == {"exact_duplicate": len(copies)}  # counts stay exact
    back = decode_documents(result.output_dir)
    assert len(back) == readable
    assert big["text"].strip() in back.values()
    rejected = [json.loads(line) for f in (result.output_dir / "rejected").rglob("*.jsonl")
                for line in f.read_text().splitlines()]
    assert sorted(r["reason"] for r in rejected if r["stage"] == "read") == sorted(
        ["bad_json", "invalid_utf8", "empty_text", "missing_text", "not_an_object", "truncated_file"]
    )
    sampled = {r["id"] for r in rejected if r["stage"] == "exact_dedup"}
    assert sampled == {c["id"] for c in copies if in_reject_sample(c["id"], 0.3)} and 0 < len(sampled) < len(copies)
    assert len(rejected) == 6 + len(sampled)


def test_inspect_cli_verifies_and_decodes(first_run, tmp_path):
    cmd = [sys.executable, "-m", "service.cli", "inspect", str(first_run.output_dir), "--decode", "1", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "checksums" in proc.stdout and "OK" in proc.stdout and "--- sample 0000000000" in proc.stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1])["samples"] == first_run.manifest.total_samples
    # a corrupted copy is caught by its checksum
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(first_run.output_dir, bad)
    shard = bad / first_run.manifest.shards[0].name
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF
    shard.write_bytes(bytes(data))
    proc = subprocess.run([sys.executable, "-m", "service.cli", "inspect", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 1 and "BAD shards/shard-000000.tar" in proc.stdout


def test_instruction_records_get_a_loss_mask(ray_local, tmp_path):
    recs = [{"instruction": f"Add {i} and {i}.", "input": "", "output": f"The sum is {2 * i}."} for i in range(40)]
    write_jsonl(tmp_path / "sft" / "i.jsonl", recs)
    inputs = [{"path": str(tmp_path / "sft"), "format": "instruction"}]
    result = run_job(_spec(str(tmp_path / "sft"), tmp_path / "out", inputs=inputs))
    assert result.manifest.has_loss_mask
    from pipeline.output.inspect import Decoder, iter_samples, split_documents

    dec = Decoder(result.output_dir)
    sample = next(iter_samples(result.output_dir))
    start = 0
    for ids in split_documents(sample):
        mask = sample.loss_mask[start : start + len(ids)]
        start += len(ids)
        prompt = dec.decode(ids[mask == 0])
        answer = dec.decode(ids[mask == 1])
        assert prompt.startswith("### Instruction:\nAdd ") and prompt.endswith("### Response:\n")
        assert answer.startswith("The sum is ")


def test_same_named_text_files_get_distinct_ids_on_every_run(ray_local, tmp_path):
    """Two ``doc.txt`` in two subfolders of one input: two ids (the path below the input), the same on
    every run and wherever the corpus lies, so the shards (meta.json holds the ids) are identical."""
    import random

    from pipeline.output.inspect import iter_samples

    runs = []
    for where in ("here", "there/deeper"):
        folder = tmp_path / where / "txt"
        for sub in ("a", "b"):
            (folder / sub).mkdir(parents=True)
            (folder / sub / "doc.txt").write_text(make_text(random.Random(sub), 80))
        runs.append(run_job(_spec(str(folder), tmp_path / where / "out")))
    ids = [[i for sample in iter_samples(r.output_dir) for i in sample.meta["doc_ids"]] for r in runs]
    assert sorted(set(ids[0])) == ["a/doc.txt:0", "b/doc.txt:0"]
    assert ids[0] == ids[1]
    assert [s.sha256 for s in runs[0].manifest.shards] == [s.sha256 for s in runs[1].manifest.shards]


def test_dedup_stages_keep_shards_identical_across_parallelism(ray_local, corpus, tmp_path):
    """The default stage list, with planted exact and near duplicates, is still deterministic."""
    import random

    folder, docs = corpus
    rng = random.Random(3)
    dups = [{"id": f"copy-{i}", "text": docs[i]["text"]} for i in range(0, 60, 3)]
    near = []
    for i in range(1, 60, 3):
        words = docs[i]["text"].split()
        if len(words) > 100:
            words[rng.randrange(len(words))] = "edited"
            near.append({"id": f"near-{i}", "text": " ".join(words)})
    write_jsonl(tmp_path / "c" / "dups.jsonl", dups + near)
    stages = [{"type": "normalize"}, {"type": "exact_dedup"}, {"type": "near_dedup", "params": {"threshold": 0.8}}]
    inputs = [{"path": str(folder)}, {"path": str(tmp_path / "c")}]
    runs = [
        run_job(_spec(str(folder), tmp_path / f"o{p}", inputs=inputs, stages=stages,
                      execution={"batch_size": b, "parallelism": p}))
        for p, b in ((1, 32), (2, 9))
    ]
    dropped = runs[0].stats["stages"]
    assert dropped[2]["dropped"]["exact_duplicate"] == len(dups)
    assert dropped[3]["dropped"]["near_duplicate"] == len(near) > 0
    assert [s.sha256 for s in runs[0].manifest.shards] == [s.sha256 for s in runs[1].manifest.shards]
    # the originals (smallest ord) are the ones kept
    kept = set(decode_documents(runs[0].output_dir).values())
    assert kept == {unicodedata.normalize("NFC", d["text"]).strip() for d in docs}


def test_split_by_language_writes_one_shard_set_per_value(ray_local, tmp_path):
    """output.split_by: OUT/<value>/ holds a complete shard set of exactly that value's documents, in order;
    a missing or reserved value goes to _unknown, so no document is lost."""
    import random

    rng = random.Random(11)
    langs = ["en", "de", "fr", None, "documents"]
    docs = [{"id": f"d{i}", "text": make_text(rng, rng.choice([10, 40, 120])), **(
        {"lang": lang} if (lang := langs[i % len(langs)]) else {})} for i in range(250)]
    write_jsonl(tmp_path / "in.jsonl", docs)
    result = run_job(_spec(str(tmp_path / "in.jsonl"), tmp_path / "out", output={
        "path": str(tmp_path / "out"), "samples_per_shard": 8, "split_by": "lang"},
        execution={"batch_size": 32, "parallelism": 2}))
    out = result.output_dir
    stats = json.loads((out / "stats.json").read_text())
    assert sorted(stats["groups"]) == ["_unknown", "de", "en", "fr"]
    assert not (out / "manifest.json").exists() and not (out / "documents").exists()
    for group in stats["groups"]:
        want = [d["text"] for d in docs if (d.get("lang") if d.get("lang") in ("en", "de", "fr") else "_unknown")
                == group]
        assert all(c.ok for c in verify_shards(out / group))
        back = decode_documents(out / group)
        assert [back[k] for k in sorted(back)] == want
        assert stats["groups"][group]["documents"] == len(want)
        assert Manifest.load(out / group).tokenizer_hash == Manifest.load(out / "de").tokenizer_hash
    assert stats["output"]["shards"] == sum(len(Manifest.load(out / g).shards) for g in stats["groups"])
