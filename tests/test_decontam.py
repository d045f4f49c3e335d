"""Benchmark decontamination: the n-gram index, the ``decontaminate`` stage (no Ray) and the report CLI.

Every benchmark and corpus here is generated in the test (the shared corpora may be absent).
"""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest

from pipeline.decontam.index import BenchmarkIndex, Item, build_index, index_files, item_texts
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
                                                   "exact": True, "span": len(words(GSM)), "field": "text",
                                                   "rule": "overlap"}]
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
    no_span = {"min_span": 1000, "min_span_share": 1.0}  # the overlap rule alone
    strict, loose = stage(bench_files(tmp_path), **no_span), stage(bench_files(tmp_path), min_overlap=0.3, **no_span)
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
    from pipeline.output.shard_set import ShardSetWriter, write_manifest
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
    gsm = words(GSM)
    # three pieces of 15 words, each under min_span (16) and under min_span_share (0.4) of the item's words:
    # laid end to end in one batch they would be a span of 45 words (and 33 of its 41 n-grams)
    assert len(gsm) * 0.4 > 15
    texts = [f"{prose(30)} What is the capital", "of Burkina Faso? " + prose(31),
             prose(32) + " " + " ".join(gsm[:15]), " ".join(gsm[15:30]), " ".join(gsm[30:45]) + " " + prose(33),
             "", SHORT]
    assert [[m.item for m in found] for found in Matcher(idx, 0.7).match_batch(texts)] == [[], [], [], [], [], [],
                                                                                          ["short"]]


def test_an_items_question_is_indexed_too_and_the_item_reported_once(tmp_path):
    question = GSM.split("\n")[0]
    write_jsonl(tmp_path / "b" / "gsm.jsonl", [{"id": "g0", "text": GSM, "question": question, "benchmark": "gsm8k"}])
    both, text_only = index_files([str(tmp_path / "b")]), index_files([str(tmp_path / "b")], text_fields=["text"])
    page = f"{prose(40)} Homework: {question} {prose(41)}"  # the question without its answer
    assert not Matcher(text_only, 0.7, min_span=1000, min_span_share=1.0).match(page)  # as overlap alone sees it
    [m] = Matcher(text_only, 0.7).match(page)  # a piece of the item: found by its span
    assert (m.item, m.field, m.rule, m.span) == ("g0", "text", "span", len(words(question)))
    [m] = Matcher(both, 0.7).match(page)
    assert (m.item, m.overlap, m.exact) == ("g0", 1.0, True)
    [m] = Matcher(both, 0.7).match(GSM)  # found through both texts: listed once
    assert (m.item, m.overlap, m.exact, m.words) == ("g0", 1.0, True, len(words(GSM)))
    assert both.items_per_benchmark() == {"gsm8k": 1}


# ---- pieces of items: answers alone, halves, labelled choices, stock phrases --------------------------------

SOLUTION = ("    running_total = 0\n    for amount in operations:\n        running_total += amount\n"
            "        if running_total < minimum_balance:\n            return True, running_total\n"
            "    return False, running_total\n")
HE = {"id": "HumanEval/3", "benchmark": "humaneval", "entry_point": "below_minimum",
      "prompt": "def below_minimum(operations: list, minimum_balance: int) -> tuple:\n"
                '    """ Report whether the running balance of the account ever falls below the minimum. """\n',
      "canonical_solution": SOLUTION,
      "test": "def check(candidate):\n    assert candidate([1, 2, -4, 5], 0) == (True, -1)\n"
              "    assert candidate([1, 2, 3], 0) == (False, 6)\n    assert candidate([], 0) == (False, 0)\n"}
GSM_REC = {"id": "gsm8k-0", "benchmark": "gsm8k", "question": GSM.split("\n")[0],
           "answer": "\n".join(GSM.split("\n")[1:])}
MC = {"id": "mmlu-x-0", "benchmark": "mmlu", "subject": "biology", "question": STOCK,
      "choices": ["Mitochondria carry their own circular genome", "Ribosomes are bounded by a double membrane",
                  "Chloroplasts occur in every animal cell", "The nucleolus exports finished proteins"],
      "answer": "A"}


def piece_bench(tmp_path):
    write_jsonl(tmp_path / "pb" / "sets.jsonl", [HE, GSM_REC, MC])
    return [str(tmp_path / "pb")]


def test_every_text_field_is_indexed_but_ids_metadata_and_test_code(tmp_path):
    idx = index_files(piece_bench(tmp_path))
    assert set(idx.fields) == {"prompt", "canonical_solution", "item", "question", "answer", "choices"}
    assert not {"test", "entry_point", "subject", "id", "benchmark"} & set(idx.fields)
    assert item_texts(MC)[-1] == ("choices", "\n".join(MC["choices"]))  # answer "A" is a label, not a text
    only = index_files(piece_bench(tmp_path), text_fields=["prompt", "question"])
    assert set(only.fields) == {"prompt", "question"}


def test_a_solution_alone_and_half_an_item_are_flagged_with_their_item_and_rule(tmp_path):
    s = stage(piece_bench(tmp_path))
    lines = GSM.split("\n")
    half = "\n".join(lines[len(lines) // 2 - 1:])  # the last lines: most of the answer, no question
    docs = [doc(0, "import os\n\n\ndef check_balance(operations, minimum_balance):\n" + SOLUTION + "\n" + prose(50)),
            doc(1, prose(51) + "\n" + half + "\n" + prose(52)),
            doc(2, prose(53))]
    res = run_batch(s, docs)
    assert [d["id"] for d in res.kept] == ["d2"]
    by_id = {d.doc["id"]: d.detail["contamination"][0] for d in res.drops}
    assert (by_id["d0"]["item"], by_id["d0"]["field"], by_id["d0"]["rule"]) == ("HumanEval/3", "canonical_solution",
                                                                                 "overlap")
    assert by_id["d0"]["overlap"] == 1.0 and by_id["d0"]["span"] == len(words(SOLUTION))
    assert by_id["d1"]["item"] == "gsm8k-0" and by_id["d1"]["rule"] in ("span", "overlap")
    assert by_id["d1"]["span"] >= len(words(half)) - 1
    # negative control: the old rule (question/prompt/text fields, overlap only) finds neither piece
    old = stage(piece_bench(tmp_path), text_fields=["text", "question", "prompt"], min_span=1000,
                min_span_share=1.0)
    assert len(run_batch(old, docs).kept) == 3


def test_labelled_choices_of_a_stock_question_are_found(tmp_path):
    s = stage(piece_bench(tmp_path))
    page = (f"{prose(60)}\nQuiz 4. {STOCK}\n"
            + "\n".join(f"({'abcd'[i]}) {c}" for i, c in enumerate(MC["choices"])) + f"\nAnswer: (a)\n{prose(61)}")
    [drop] = run_batch(s, [doc(0, page)]).drops
    found = drop.detail["contamination"][0]
    assert found["item"] == "mmlu-x-0" and found["field"] in ("choices", "item", "question+choices")
    assert words("A. Mitochondria (b) x Q: y") == ["mitochondria", "x", "y"]  # labels are no words; x stays


def test_hard_negatives_are_not_contamination(tmp_path):
    s = stage(piece_bench(tmp_path))
    docs = [doc(0, "def below_minimum(operations, minimum_balance):\n    \"\"\"Helper.\"\"\"\n"
                   "    return min(operations) < minimum_balance\n"),  # the entry point's name, another body
            doc(1, HE["test"] + "\nif __name__ == '__main__':\n    check(below_minimum)\n"),  # the test harness
            doc(2, f"{prose(70)} Which of the following statements about mitochondria is true? None. {prose(71)}"),
            doc(3, "Natalia sold clips to 12 of her friends in June. How many clips did Natalia sell?")]
    res = run_batch(s, docs)
    assert len(res.kept) == 4 and not res.drops
    # control: with the test harness indexed, the harness page is flagged (as HumanEval's own tests)
    everything = stage(piece_bench(tmp_path), exclude_fields=["id", "benchmark", "entry_point", "subject"])
    assert [d.doc["id"] for d in run_batch(everything, docs).drops] == ["d1"]


def test_a_stock_phrase_is_never_part_of_a_span(tmp_path):
    boiler = ("Read the following passage carefully and then answer the question that follows using only the "
              "information given in the passage above")  # 22 words, in seven items
    items = [{"id": f"r{i}", "question": f"{boiler}. {make_text(random.Random(180 + i), 60)}"} for i in range(7)]
    write_jsonl(tmp_path / "rc" / "reading.jsonl", items)
    page = f"{prose(81)} {boiler}. {prose(82)}"
    assert not run_batch(stage([str(tmp_path / "rc")]), [doc(0, page)]).drops
    # control: with a higher bar for stock phrases the same 22 words are a span of all seven items
    [drop] = run_batch(stage([str(tmp_path / "rc")], common_items=8), [doc(0, page)]).drops
    assert {m["item"] for m in drop.detail["contamination"]} == {f"r{i}" for i in range(7)}
    assert drop.detail["contamination"][0]["rule"] == "span"


def test_span_params_are_checked():
    with pytest.raises(ValueError, match="min_span"):
        Decontaminate.Params(benchmarks=["x"], min_span=12)
    with pytest.raises(ValueError):
        Decontaminate.Params(benchmarks=["x"], min_span_share=0)


def test_report_lists_items_per_field_and_rule(tmp_path, capsys):
    lines = GSM.split("\n")
    docs = [{"id": "c0", "text": prose(90) + "\n" + SOLUTION}, {"id": "c1", "text": prose(91)},
            {"id": "c2", "text": "\n".join(lines[len(lines) // 2 - 1:])}]
    write_jsonl(tmp_path / "corpus" / "c.jsonl", docs)
    assert report_main([str(tmp_path / "corpus"), "-b", *piece_bench(tmp_path), "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["contaminated_docs"] == 2
    assert r["benchmarks"]["humaneval"]["items_by_field"] == {"canonical_solution": 1}
    assert r["benchmarks"]["humaneval"]["items_by_rule"] == {"overlap": 1}
    assert sum(r["benchmarks"]["gsm8k"]["items_by_rule"].values()) >= 1
    assert report_main([str(tmp_path / "corpus"), "-b", *piece_bench(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "canonical_solution 1" in out and "by canonical_solution:overlap" in out
    assert report_main([str(tmp_path / "corpus"), "-b", *piece_bench(tmp_path), "--min-span", "5"]) == 2


def test_a_short_question_with_one_of_its_answers_is_found(tmp_path):
    # TruthfulQA's shape: text == question, both short; the page shows the question with its best answer only
    rec = {"id": "tq-67", "benchmark": "truthfulqa", "text": "Are vampires real?", "question": "Are vampires real?",
           "best_answer": "No, vampires are not real",
           "correct_answers": "No, vampires are not real; No, vampires are fictional; No, vampires do not exist",
           "incorrect_answers": "Yes, vampires are real; Yes, vampires exist"}
    write_jsonl(tmp_path / "tq" / "truthfulqa.jsonl", [rec])
    s = stage([str(tmp_path / "tq")])
    page = f"{prose(95)}\nQ: Are vampires real?\nA: No, vampires are not real\n{prose(96)}"
    [drop] = run_batch(s, [doc(0, page)]).drops
    found = drop.detail["contamination"][0]
    assert (found["item"], found["field"], found["rule"], found["exact"]) == ("tq-67", "question+best_answer", "whole",
                                                                             True)
    # each piece alone is under its floor (3 and 5 words): everyday phrases, not evidence
    assert not run_batch(s, [doc(1, f"{prose(97)} Are vampires real? {prose(98)}")]).drops
    assert not run_batch(s, [doc(2, f"{prose(97)} No, vampires are not real. {prose(98)}")]).drops


def test_a_row_of_numbers_is_no_span(tmp_path, monkeypatch):
    import pipeline.decontam.index as index_module

    rec = {"id": "mmlu-ml-22", "benchmark": "mmlu", "question": "What is the rank of the following matrix? "
           "A = [[1, 1, 1], [1, 1, 1], [1, 1, 1]]", "choices": ["0", "1", "2", "3"], "answer": "B"}
    write_jsonl(tmp_path / "m" / "mmlu.jsonl", [rec])
    header = "static const int ones[] = {" + ", ".join(["1"] * 40) + ", 0, 1, 2, 3};\n"
    assert not run_batch(stage([str(tmp_path / "m")]), [doc(0, prose(99) + "\n" + header)]).drops
    monkeypatch.setattr(index_module, "SPAN_LETTER_WORDS", 0)  # control: numbers may form a span
    [drop] = run_batch(stage([str(tmp_path / "m")]), [doc(0, prose(99) + "\n" + header)]).drops
    assert drop.detail["contamination"][0]["rule"] == "span"
