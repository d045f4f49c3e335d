"""Benchmark decontamination: the n-gram index, the ``decontaminate`` stage (no Ray) and the report CLI.

Every benchmark and corpus here is generated in the test (the shared corpora may be absent).
"""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest

from pipeline.decontam.index import BenchmarkIndex, Item, build_index, index_files
from pipeline.decontam.match import Matcher
from pipeline.decontam.ngrams import Prefix, word_values, words
from pipeline.decontam.report import main as report_main
from pipeline.decontam.stage import Decontaminate
from pipeline.stages.base import StageContext, run_batch
from tests.corpus_fixtures import make_text, write_jsonl

GSM = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
       "How many clips did Natalia sell altogether in April and May?\n"
       "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
       "Natalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72")
CODE = ('def below_zero(operations: List[int]) -> bool:\n'
        '    """ Detect if at any point the balance of the account falls below zero. """\n'
        '    balance = 0\n'
        '    for op in operations:\n'
        '        balance += op\n'
        '        if balance < 0:\n'
        '            return True\n'
        '    return False\n')
#: a long item holding one stock phrase that ordinary prose also uses
LONG = ("A farmer in a small village noticed that in the middle of the night when everyone else in the house was "
        "fast asleep his cows would wander off toward the northern hills and return by dawn with burrs in their coats; "
        "what explains the route the cows most likely followed across the frozen river?")
COMMON = "in the middle of the night when everyone else in the house was fast asleep"  # 15 words
STOCK = "Which of the following is true?"
SHORT = "What is the capital of Burkina Faso?"


def bench_files(tmp_path):
    write_jsonl(tmp_path / "bench" / "gsm8k_test.jsonl.gz", [
        {"id": "gsm8k-0", "text": GSM, "benchmark": "gsm8k"},
        {"id": "gsm8k-1", "text": LONG, "benchmark": "gsm8k"},
    ], compress=True)
    write_jsonl(tmp_path / "bench" / "humaneval.jsonl", [{"id": "HumanEval/3", "text": CODE}])  # name: file's
    write_jsonl(tmp_path / "bench" / "quiz.jsonl", [
        {"id": "q-0", "text": SHORT, "benchmark": "quiz"},
        {"id": "q-1", "text": "Who are you?", "benchmark": "quiz"},  # 3 words: too short
        *({"id": f"q-s{i}", "text": STOCK, "benchmark": "quiz"} for i in range(2)),  # stock: in 3 items
        {"id": "q-3", "text": f"Cells divide by mitosis. {STOCK}", "benchmark": "quiz"},
    ])
    return [str(tmp_path / "bench")]


def prose(seed: int, n: int = 120) -> str:
    return make_text(random.Random(seed), n)


def stage(paths, **params) -> Decontaminate:
    s = Decontaminate(Decontaminate.Params(benchmarks=paths, **params), StageContext("t", "", 1, ""))
    s.prepared = s.prepare()
    s.setup()
    return s


def doc(i: int, text: str) -> dict:
    return {"id": f"d{i}", "text": text, "source": "c.jsonl", "ord": i, "meta": {}, "segments": None}


# ---- normalization and hashing ------------------------------------------------------------------------

def test_words_ignore_case_whitespace_punctuation_and_width():
    assert words("  Hello,\n\tWORLD!  ｆｏｏ_bar  ") == ["hello", "world", "foo_bar"]


def test_window_hashes_depend_only_on_the_words_in_the_window():
    v = word_values(np.arange(40))
    whole = Prefix(v)
    for start, length in [(0, 13), (5, 13), (27, 13), (3, 4)]:
        alone = Prefix(v[start:start + length]).windows(np.array([0]), length)
        assert whole.windows(np.array([start]), length)[0] == alone[0]
    assert whole.windows(np.array([0]), 4)[0] != whole.windows(np.array([1]), 4)[0]
    assert whole.windows(np.array([0]), 4)[0] != whole.windows(np.array([0]), 5)[0]


# ---- the index ----------------------------------------------------------------------------------------

def test_index_names_benchmarks_and_counts_short_and_stock_items(tmp_path):
    idx = index_files(bench_files(tmp_path))
    assert idx.benchmarks == ["gsm8k", "humaneval", "quiz"]  # field, else the file's name
    assert idx.items_per_benchmark() == {"gsm8k": 2, "humaneval": 1, "quiz": 2}
    assert idx.skipped == {"quiz": 1} and idx.stock == {"quiz": 2}
    indexed = {idx.item_ids[i] for i in idx.text_item}
    assert {"q-0", "q-3"} <= indexed and not {"q-1", "q-s0", "q-s1"} & indexed
    assert len(idx.keys) == 2 + sum(len(words(t)) - 12 for t in (GSM, LONG, CODE))  # 2 heads + the 13-grams


def test_prepared_index_is_plain_data_and_survives_pickling(tmp_path):
    s = stage(bench_files(tmp_path))
    plain = s.prepared
    assert isinstance(plain, dict) and isinstance(plain["keys"], np.ndarray) and plain["keys"].dtype == np.uint64
    assert np.all(np.diff(plain["keys"].astype(object)) > 0)  # sorted and unique
    back = Matcher(BenchmarkIndex.from_plain(pickle.loads(pickle.dumps(plain))), 0.7)
    assert [m.item for m in back.match(prose(1) + GSM)] == ["gsm8k-0"]


# ---- the stage ------------------------------------------------------------------------------------------

def test_catches_items_reflowed_recased_and_reindented(tmp_path):
    s = stage(bench_files(tmp_path))
    reflowed = " ".join(GSM.split()).upper()  # one line, upper case
    reindented = CODE.replace("    ", "\t").replace("def ", "  def ", 1)  # tabs instead of 4 spaces
    short = SHORT.lower().replace(" ", "\n  ")
    docs = [doc(0, prose(1) + "\n" + reflowed + "\n" + prose(2)),
            doc(1, "Here is my homework:\n```python\n" + reindented + "```\nThanks!"),
            doc(2, prose(3) + " " + short + " " + prose(4)),
            doc(3, prose(5))]
    res = run_batch(s, docs)
    assert [d["id"] for d in res.kept] == ["d3"]
    by_id = {d.doc["id"]: d for d in res.drops}
    assert by_id["d0"].reason == "decontaminate:gsm8k"
    assert by_id["d1"].reason == "decontaminate:humaneval"
    assert by_id["d2"].reason == "decontaminate:quiz"
    assert by_id["d0"].detail["contamination"] == [{"benchmark": "gsm8k", "item": "gsm8k-0", "overlap": 1.0,
                                                   "exact": True}]
    assert by_id["d1"].doc["meta"]["contamination"][0]["item"] == "HumanEval/3"
    assert res.metrics.counters["docs:gsm8k"] == 1 and res.metrics.counters["exact_docs:humaneval"] == 1


def test_a_shared_common_phrase_or_stock_question_is_not_contamination(tmp_path):
    s = stage(bench_files(tmp_path))
    docs = [doc(0, f"{prose(6)} She woke {COMMON} and walked out. {prose(7)}"),  # a 13-gram of LONG
            doc(1, f"Quiz night! {STOCK} The sun is a star. {prose(8)}"),  # a stock question
            doc(2, f"{prose(9)} Who are you? {prose(10)}"),  # a too-short item
            doc(3, f"{prose(11)} What is the capital of France? {prose(12)}")]  # 6 of the 7 words of SHORT
    res = run_batch(s, docs)
    assert len(res.kept) == 4 and not res.drops
    assert not any("contamination" in d["meta"] for d in res.kept)
    # the phrase does hit three of LONG's 13-grams: a small overlap, under the threshold
    [hit] = Matcher(s.matcher.index, 0.01).match(docs[0]["text"])
    assert hit.item == "gsm8k-1" and hit.overlap == pytest.approx(3 / (len(words(LONG)) - 12))


def test_overlap_is_the_fraction_of_the_items_ngrams(tmp_path):
    gsm = words(GSM)
    half = " ".join(gsm[: len(gsm) // 2])  # the question without the answer: about half of the 13-grams
    strict, loose = stage(bench_files(tmp_path)), stage(bench_files(tmp_path), min_overlap=0.3)
    assert not run_batch(strict, [doc(0, half)]).drops
    [drop] = run_batch(loose, [doc(0, half)]).drops
    overlap = drop.detail["contamination"][0]["overlap"]
    grams = len(gsm) - 13 + 1
    assert overlap == round((len(gsm) // 2 - 13 + 1) / grams, 4)
    assert drop.detail["contamination"][0]["exact"] is False


def test_annotate_keeps_and_flags_filter_drops(tmp_path):
    texts = [prose(20) + " " + GSM, prose(21)]
    annotate = run_batch(stage(bench_files(tmp_path), mode="annotate"), [doc(i, t) for i, t in enumerate(texts)])
    assert len(annotate.kept) == 2 and not annotate.drops
    flagged, clean = annotate.kept
    verdict = flagged["meta"]["filters"]["decontaminate"]
    assert (verdict["keep"], verdict["reason"], verdict["scores"]) == (False, "decontaminate:gsm8k", {"overlap": 1.0})
    assert flagged["meta"]["contamination"][0]["item"] == "gsm8k-0"
    assert clean["meta"]["filters"]["decontaminate"]["keep"] is True and "contamination" not in clean["meta"]
    assert annotate.metrics.counters["would_drop:decontaminate:gsm8k"] == 1
    assert annotate.metrics.scores["overlap"].summary()["count"] == 2

    filtered = run_batch(stage(bench_files(tmp_path)), [doc(i, t) for i, t in enumerate(texts)])
    assert [d["id"] for d in filtered.kept] == ["d1"] and [d.reason for d in filtered.drops] == ["decontaminate:gsm8k"]
    assert "would_drop:decontaminate:gsm8k" not in filtered.metrics.counters


def test_meta_as_a_json_string_is_kept(tmp_path):
    d = doc(0, GSM)
    d["meta"] = json.dumps({"url": "u"})
    [kept] = run_batch(stage(bench_files(tmp_path), mode="annotate"), [d]).kept
    assert kept["meta"]["url"] == "u" and kept["meta"]["contamination"][0]["item"] == "gsm8k-0"


def test_preflight_and_params(tmp_path):
    ctx = StageContext("t", "", 1, "")
    with pytest.raises(ValueError, match="^benchmarks: name at least one"):
        Decontaminate(Decontaminate.Params(), ctx).preflight()
    with pytest.raises(ValueError, match="^benchmarks: no file matches"):
        Decontaminate(Decontaminate.Params(benchmarks=[str(tmp_path / "nope.jsonl")]), ctx).preflight()
    with pytest.raises(ValueError, match="min_words"):
        Decontaminate.Params(benchmarks=["x"], ngram=8, min_words=9)
    assert Decontaminate.path_params == ("benchmarks",)


def test_duplicate_items_both_match_and_the_longest_item_ranks_first():
    long = f"Quiz: {SHORT} Answer: Ouagadougou, of course."
    idx = build_index([Item("b", "a", SHORT), Item("b", "a2", SHORT), Item("b", "long", long)], stock_items=4)
    got = Matcher(idx, 0.7).match(long)
    assert [m.item for m in got] == ["long", "a", "a2"] and all(m.exact for m in got)


# ---- the report ----------------------------------------------------------------------------------------

def corpus(tmp_path):
    docs = [{"id": f"c{i}", "text": prose(100 + i)} for i in range(20)]
    docs[3]["text"] += "\n" + GSM.upper()
    docs[7]["text"] += "\n" + GSM
    docs[11]["text"] = CODE.replace("    ", "  ") + docs[11]["text"]
    write_jsonl(tmp_path / "corpus" / "part-0.jsonl", docs[:10])
    write_jsonl(tmp_path / "corpus" / "part-1.jsonl.gz", docs[10:], compress=True)
    return docs


def test_report_on_a_jsonl_corpus(tmp_path, capsys):
    corpus(tmp_path)
    bench = bench_files(tmp_path)
    assert report_main([str(tmp_path / "corpus"), "-b", *bench, "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["docs"] == 20 and r["contaminated_docs"] == 3
    assert r["benchmarks"]["gsm8k"]["docs_exact"] == 2 and r["benchmarks"]["gsm8k"]["items_found_overlap"] == 1
    assert r["benchmarks"]["gsm8k"]["doc_rate_overlap"] == 0.1
    assert r["benchmarks"]["humaneval"]["docs_overlap"] == 1 and r["benchmarks"]["quiz"]["docs_overlap"] == 0
    assert r["benchmarks"]["quiz"]["items_skipped"] == 1 and r["benchmarks"]["quiz"]["items_stock"] == 2
    worst = r["worst_items"][0]
    assert (worst["item"], worst["docs"], worst["examples"]) == ("gsm8k-0", 2, ["c3", "c7"])

    # a gate: above the rate, exit 1; the table names the benchmark
    assert report_main([str(tmp_path / "corpus"), "-b", *bench, "--max-rate", "0.05"]) == 1
    out = capsys.readouterr().out
    assert "gsm8k-0" in out and "above 0.05: gsm8k\n" in out
    assert report_main([str(tmp_path / "corpus"), "-b", str(tmp_path / "missing.jsonl")]) == 2
    assert "no file matches" in capsys.readouterr().err


def test_report_on_a_shard_set_decodes_documents(tmp_path, capsys):
    from pipeline.output.shard_writer import ShardSetWriter, write_manifest
    from pipeline.packing import BestFitPacker
    from pipeline.shard_format import TOKENIZER, Manifest, token_dtype
    from pipeline.spec import TokenizerSpec
    from pipeline.tokenize import DocEncoder, TokenizerInfo, special_tokens, train_bpe

    docs = corpus(tmp_path)
    spec = TokenizerSpec()
    tok = train_bpe([d["text"] for d in docs], 400, 1, special_tokens(spec))
    info = TokenizerInfo.resolve(tok, spec)
    out = tmp_path / "out"
    writer = ShardSetWriter(out, 4, token_dtype(info.vocab_size))
    packer = BestFitPacker(64)  # shorter than the documents: each is re-assembled from several samples
    for i, (ids, mask) in enumerate(DocEncoder(tok, info).encode([d["text"] for d in docs], [""] * len(docs))):
        for seq in packer.add(docs[i]["id"], ids, mask, i):
            writer.add(seq)
    for seq in packer.flush():
        writer.add(seq)
    writer.close()
    (out / TOKENIZER).write_text(tok.to_str())
    write_manifest(out, Manifest(spec_hash="t", tokenizer_hash=info.sha256, seq_len=64,
                                 dtype=token_dtype(info.vocab_size).name, vocab_size=info.vocab_size,
                                 samples_per_shard=4, bos_id=info.bos_id, eos_id=info.eos_id, pad_id=info.pad_id,
                                 has_loss_mask=False, shards=writer.shards))
    assert len(writer.shards) > 1

    assert report_main([str(out), "-b", *bench_files(tmp_path), "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["docs"] == 20 and r["contaminated_docs"] == 3
    assert r["worst_items"][0]["item"] == "gsm8k-0" and r["worst_items"][0]["examples"] == ["ord:3", "ord:7"]
    assert report_main([str(out), "-b", *bench_files(tmp_path), "--from", "documents"]) == 2
    assert "no documents/ output" in capsys.readouterr().err


def test_no_match_spans_two_documents_of_a_batch():
    idx = build_index([Item("b", "short", SHORT), Item("b", "long", GSM)])
    gsm = GSM.split()
    texts = [f"{prose(30)} What is the capital", "of Burkina Faso? " + prose(31),
             " ".join(gsm[:30]), " ".join(gsm[30:]), "", SHORT]
    assert [[m.item for m in found] for found in Matcher(idx, 0.7).match_batch(texts)] == [[], [], [], [], [],
                                                                                          ["short"]]


def test_an_items_question_is_indexed_too_and_the_item_reported_once(tmp_path):
    question = GSM.split("\n")[0]
    write_jsonl(tmp_path / "b" / "gsm.jsonl", [{"id": "g0", "text": GSM, "question": question, "benchmark": "gsm8k"}])
    both, text_only = index_files([str(tmp_path / "b")]), index_files([str(tmp_path / "b")], text_fields=["text"])
    page = f"{prose(40)} Homework: {question} {prose(41)}"  # the question without its answer
    assert not Matcher(text_only, 0.7).match(page)
    [m] = Matcher(both, 0.7).match(page)
    assert (m.item, m.overlap, m.exact) == ("g0", 1.0, True)
    [m] = Matcher(both, 0.7).match(GSM)  # found through both texts: listed once
    assert (m.item, m.overlap, m.exact, m.words) == ("g0", 1.0, True, len(words(GSM)))
    assert both.items_per_benchmark() == {"gsm8k": 1}
