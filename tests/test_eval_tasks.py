"""``tokenmill eval`` (issue 40): its scores equal a by-hand log-likelihood on a tiny model, items split by a job.

A tiny Llama (random init, fixed seed, fp32) is saved as a trainer checkpoint (DCP files, ``trainer.json``, the
run's ``config.json`` naming a shard set with its tokenizer and manifest, BOS and EOS) and evaluated on small
benchmark files in the shared files' formats. The by-hand side shares no code with ``training.evaluate`` or
``training.scoring``: it tokenizes with the tokenizer itself, runs the model on the whole sequence, takes
log-softmax and sums the target tokens' log-probabilities in a loop. No Ray, in seconds.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from tokenizers import Tokenizer

import tokenmill
from kernels.attention import DocMask
from pipeline.decontam.index import read_items
from pipeline.output.shard_set import write_shard_set
from pipeline.tokenize import train_bpe
from training.evaluate import cli
from training.evaluate.answer import answer_results
from training.evaluate.bench import ANSWER_FORMATS, CHOICE_FORMATS, read_records
from training.evaluate.choice import choice_loglikelihoods, choice_results
from training.evaluate.contamination import found_items, split
from training.evaluate.heldout import shard_results, text_results
from training.evaluate.results import ItemResult, summarize
from training.evaluate.scorer import Scorer, load_scorer, windows
from training.model import Llama, ModelConfig

SEQ = 128
BOS, EOS = "<|bos|>", "<|endoftext|>"
TEXTS = ["the quick brown fox jumps over the lazy dog. ", "def add(a, b):\n    return a + b\n",
         "Question: what is two plus two?\nAnswer: four. ", "Which planet is red? Mars, Venus, Earth. "] * 20
MMLU = [
    {"id": "mmlu-x-0", "benchmark": "mmlu", "subject": "x", "question": "What is two plus two?",
     "choices": ["three", "four", "five", "six"], "answer": "B"},
    {"id": "mmlu-x-1", "benchmark": "mmlu", "subject": "x", "question": "Which planet is red?",
     "choices": ["Mars", "Venus", "Earth", "the quick brown fox"], "answer": "A"},
    {"id": "mmlu-x-2", "benchmark": "mmlu", "subject": "x", "question": "def add(a, b) returns?",
     "choices": ["a - b", "a * b", "a + b", "b"], "answer": 2},
]
TRUTHFULQA = [{"id": "truthfulqa-0", "benchmark": "truthfulqa", "question": "What does a fox jump over?",
               "best_answer": "The lazy dog", "correct_answers": "The dog; A dog",
               "incorrect_answers": "The moon; A red planet; Nothing"}]
GSM8K = [{"id": "gsm8k-test-0", "benchmark": "gsm8k", "question": "What is two plus two?",
          "answer": "Two plus two is 2+2=<<2+2=4>>4.\n#### 4"},
         {"id": "gsm8k-test-1", "benchmark": "gsm8k", "question": "Which planet is red?",
          "answer": "Mars is red, 5 € a ticket.\n#### Mars"}]
HUMANEVAL = [{"id": "HumanEval/0", "benchmark": "humaneval", "prompt": "def add(a, b):\n",
              "canonical_solution": "    return a + b\n", "test": "def check(candidate): pass", "entry_point": "add"}]


def _jsonl(path: Path, records: list[dict[str, Any]]) -> str:
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return str(path)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one thread scores them without waiting on a second one busy with another test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict[str, Any]:
    """A run folder with one checkpoint of a tiny random model, its shard set (tokenizer, manifest) and
    benchmark files."""
    root = tmp_path_factory.mktemp("eval")
    data = root / "data"
    data.mkdir()
    tok = train_bpe(TEXTS, 300, 1, [EOS, BOS])
    tok.save(str(data / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    docs = [np.array([tok.token_to_id(BOS), *tok.encode(t).ids, tok.token_to_id(EOS)]) for t in TEXTS[:8]]
    write_shard_set(data, ((d, np.array([len(d)]), None) for d in docs), seq_len=SEQ, vocab_size=vocab,
                    samples_per_shard=3, bos_id=tok.token_to_id(BOS), eos_id=tok.token_to_id(EOS),
                    spec_hash="test", tokenizer_hash="test-tokenizer")
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64 * math.ceil(vocab / 64), dim=32, n_layers=2, n_heads=4, max_seq_len=SEQ)
    model = Llama(cfg)
    ckpt = root / "run" / "checkpoints" / "step-00000001"
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(ckpt), no_dist=True)
    (ckpt / "trainer.json").write_text(json.dumps({"step": 1, "model": cfg.to_dict(), "strategy": "fsdp"}))
    (root / "run" / "config.json").write_text(json.dumps({"data": {"path": str(data)}}))
    bench = root / "bench"
    bench.mkdir()
    files = {"mmlu": _jsonl(bench / "mmlu_test.jsonl.gz", MMLU), "truthfulqa": _jsonl(bench / "tqa.jsonl", TRUTHFULQA),
             "gsm8k": _jsonl(bench / "gsm8k.jsonl", GSM8K), "humaneval": _jsonl(bench / "he.jsonl", HUMANEVAL),
             "text": _jsonl(bench / "heldout.jsonl", [{"text": t} for t in TEXTS[:3]] + [{"text": "é€ unseen ✓"}])}
    return {"root": root, "ckpt": ckpt, "data": data, "model": model, "tok": tok, "files": files}


@pytest.fixture(scope="module")
def scorer(run) -> Scorer:
    return load_scorer(str(run["ckpt"]))


def by_hand_loglik(model: torch.nn.Module, context: list[int], target: list[int]) -> float:
    """Summed log-probability of ``target`` after ``context``: the model on the whole sequence, log-softmax, a loop."""
    ids = torch.tensor(context + target)
    n = len(ids)
    with torch.no_grad():
        logits = model(ids[None], torch.arange(n)[None], DocMask.from_segment_lengths(torch.tensor([n]), 1, n))[0]
    logp = torch.log_softmax(logits.double(), dim=-1)
    return sum(float(logp[t - 1, ids[t]]) for t in range(len(context), n))


def _encode(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def test_multiple_choice_equals_a_by_hand_log_likelihood(run, scorer):
    tok, bos = run["tok"], run["tok"].token_to_id(BOS)
    items = [CHOICE_FORMATS["mmlu"](r) for r in read_records(run["files"]["mmlu"])]
    items += [CHOICE_FORMATS["truthfulqa"](r) for r in read_records(run["files"]["truthfulqa"])]
    assert [i.answer for i in items] == [1, 0, 2, 0]
    assert items[3].choices == (" The lazy dog", " The moon", " A red planet", " Nothing")
    got, results = choice_loglikelihoods(scorer, items), choice_results(scorer, items)
    for item, values, result in zip(items, got, results, strict=True):
        r = item.record.data
        texts = r["choices"] if "choices" in r else [r["best_answer"], *r["incorrect_answers"].split("; ")]
        context = [bos, *_encode(tok, f"Question: {r['question']}\nAnswer:")]
        expected = [by_hand_loglik(run["model"], context, _encode(tok, " " + c)) for c in texts]
        assert values == pytest.approx(expected, rel=1e-5, abs=1e-5)
        assert result.correct == (int(np.argmax(expected)) == item.answer)
        per_byte = [v / len((" " + c).encode()) for v, c in zip(expected, texts, strict=True)]
        assert result.correct_norm == (int(np.argmax(per_byte)) == item.answer)
    assert any(r.correct for r in results) and not all(r.correct for r in results)


def test_conditional_bpb_equals_by_hand(run, scorer):
    tok, bos = run["tok"], run["tok"].token_to_id(BOS)
    nll, nbytes, results = 0.0, 0, []
    for kind in ("gsm8k", "humaneval"):
        items = [ANSWER_FORMATS[kind](r) for r in read_records(run["files"][kind])]
        for item in items:
            r = item.record.data
            prompt, answer = ((f"Question: {r['question']}\nAnswer:", " " + r["answer"]) if kind == "gsm8k"
                              else (r["prompt"], r["canonical_solution"]))
            nll -= by_hand_loglik(run["model"], [bos, *_encode(tok, prompt)], _encode(tok, answer))
            nbytes += len(answer.encode())
        results += answer_results(scorer, items)
    report = summarize("bpb", results)
    assert report["bytes"] == nbytes
    assert report["value"] == pytest.approx(nll / math.log(2) / nbytes, rel=1e-6)


def test_bpb_of_jsonl_text_equals_by_hand(run, scorer):
    tok = run["tok"]
    nll, nbytes = 0.0, 0
    for t in [*TEXTS[:3], "é€ unseen ✓"]:
        ids = [tok.token_to_id(BOS), *_encode(tok, t), tok.token_to_id(EOS)]
        nll -= by_hand_loglik(run["model"], ids[:1], ids[1:])
        nbytes += len(t.encode())
    report = summarize("bpb", list(text_results(scorer, run["files"]["text"], None)))
    assert (report["items"], report["bytes"]) == (4, nbytes)
    assert report["value"] == pytest.approx(nll / math.log(2) / nbytes, rel=1e-6)


def test_bpb_of_documents_is_the_same_as_a_shard_set_or_as_jsonl(run, scorer, tmp_path):
    """The shard set holds TEXTS[:8] as the pipeline packs documents (BOS, text, EOS): the same figure."""
    text = _jsonl(tmp_path / "same.jsonl", [{"text": t} for t in TEXTS[:8]])
    shards = summarize("bpb", list(shard_results(scorer, str(run["data"]), None)))
    assert summarize("bpb", text_results(scorer, text, None)) == pytest.approx(shards, rel=1e-6)


@pytest.mark.parametrize("n,context,min_context", [(10, 1, 1), (300, 1, 1), (300, 200, 64), (129, 5, 64)])
def test_windows_score_every_target_once_within_the_model_length(n, context, min_context):
    scored = []
    for start, end, first in windows(n, context, SEQ, min_context):
        assert end - start <= SEQ and start < first
        assert first - start >= min(min_context, first)
        scored += range(first, end)
    assert scored == list(range(context, n))


def test_item_ids_are_the_decontaminate_stages(tmp_path):
    """The same file gives the same (benchmark, id) pairs as the stage's reader: own ids, int ids, line numbers
    (blank lines counted) and the file's name where a record has no benchmark."""
    path = tmp_path / "quiz_test.jsonl"
    records = [{"id": "q-0", "benchmark": "quiz", "question": "What is two plus two here?", "answer": "four things"},
               {"id": 7, "question": "Which planet is the red one?", "answer": "Mars is the red one"},
               {"question": "Who jumps over the lazy dog?", "answer": "the quick brown fox"}]
    path.write_text(json.dumps(records[0]) + "\n\n" + json.dumps(records[1]) + "\n" + json.dumps(records[2]) + "\n")
    theirs = [(i.benchmark, i.id) for i in read_items([str(path)])]
    ours = [(r.benchmark, r.id) for r in read_records(str(path))]
    assert ours == theirs == [("quiz", "q-0"), ("quiz_test", "7"), ("quiz_test", "quiz_test.jsonl:3")]


def _job(folder: Path, found: list[str], stage: str = "03-decontaminate") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    counters = {"docs:mmlu": 2, **{f"item:{key}": 1 for key in found}}
    (folder / "stats.json").write_text(json.dumps({"stages": [
        {"stage": "00-read", "docs_in": 5, "docs_out": 5},
        {"stage": stage, "docs_in": 5, "docs_out": 3, "counters": counters}]}))
    return str(folder)


def test_contamination_split_puts_exactly_the_found_items_in_found(tmp_path):
    job = _job(tmp_path / "job", ["mmlu:mmlu-x-1", "mmlu:mmlu.jsonl:4", "gsm8k:mmlu-x-2"])
    results = [ItemResult("mmlu", i, correct=True) for i in ("mmlu-x-0", "mmlu-x-1", "mmlu-x-2", "mmlu.jsonl:4")]
    clean, hit = split(results, found_items(job))
    assert [r.id for r in hit] == ["mmlu-x-1", "mmlu.jsonl:4"]
    assert [r.id for r in clean] == ["mmlu-x-0", "mmlu-x-2"]  # gsm8k's mmlu-x-2 is another benchmark's item


def test_the_items_a_decontaminate_stage_finds_are_the_items_split_off(run, scorer, tmp_path):
    """The stage itself (in process, as a job's worker runs it) finds a page's items; its counters, as stats.json
    records them, name exactly the items the evaluation puts in ``found``."""
    page = "Quiz night at the pub. Which planet is red? Mars of course, said everyone."
    applied = tokenmill.apply("decontaminate", [{"text": page}, {"text": "nothing to see here at all"}],
                              {"benchmarks": [run["files"]["mmlu"], run["files"]["gsm8k"]]})
    job = tmp_path / "job"
    job.mkdir()
    (job / "stats.json").write_text(json.dumps({"stages": [
        {"stage": "02-decontaminate", "counters": dict(applied.metrics.counters)}]}))
    found = found_items(str(job))
    mmlu = choice_results(scorer, [CHOICE_FORMATS["mmlu"](r) for r in read_records(run["files"]["mmlu"])])
    gsm8k = answer_results(scorer, [ANSWER_FORMATS["gsm8k"](r) for r in read_records(run["files"]["gsm8k"])])
    assert [[r.id for r in split(results, found)[1]] for results in (mmlu, gsm8k)] == [["mmlu-x-1"], ["gsm8k-test-1"]]


def _cli(*args: str) -> int:
    return cli.main(list(args))


def test_cli_writes_json_and_markdown_with_the_clean_split(run, tmp_path, capsys):
    f = run["files"]
    job = _job(tmp_path / "job", ["mmlu:mmlu-x-1", "gsm8k:gsm8k-test-0"])
    tasks = ",".join([f"mmlu:{f['mmlu']}", f"truthfulqa:{f['truthfulqa']}", f"gsm8k:{f['gsm8k']}",
                      f"humaneval:{f['humaneval']}", f"bpb:{f['text']}", f"val=bpb:{run['data']}"])
    out_json, out_md = tmp_path / "eval.json", tmp_path / "eval.md"
    assert _cli("--model", str(run["root"] / "run"), "--tasks", tasks, "--job", job, "--json", str(out_json),
                "--markdown", str(out_md)) == 0
    report = json.loads(out_json.read_text())
    assert report["model"] == str(run["ckpt"])
    t = report["tasks"]
    assert list(t) == ["mmlu", "truthfulqa", "gsm8k", "humaneval", "bpb", "val"]
    assert (t["mmlu"]["metric"], t["mmlu"]["items"], t["mmlu"]["found"], t["mmlu"]["clean"]["items"]) == \
        ("accuracy", 3, 1, 2)
    assert (t["gsm8k"]["metric"], t["gsm8k"]["found"], t["gsm8k"]["clean"]["items"]) == ("bpb", 1, 1)
    assert t["humaneval"]["found"] == 0 and t["humaneval"]["clean"]["value"] == t["humaneval"]["value"]
    assert t["val"]["items"] == 8 and t["val"]["value"] > 0 and "found" not in t["val"]
    table = capsys.readouterr().out
    assert table == out_md.read_text()
    assert "| task | metric | all | items | clean | clean items | found |" in table
    mmlu = next(line for line in table.splitlines() if line.startswith("| mmlu ⚠ | accuracy |"))
    assert mmlu.endswith(" | 3 | " + " (norm ".join(f"{t['mmlu']['clean'][k]:.4f}" for k in ("value", "acc_norm"))
                         + ") | 2 | 1 |"), mmlu
    assert "| gsm8k ⚠ | bpb |" in table and "| humaneval | bpb |" in table and "| val | bpb |" in table
    again = tmp_path / "again.json"
    assert _cli("--model", str(run["ckpt"]), "--tasks", tasks, "--job", job, "--json", str(again)) == 0
    assert json.loads(again.read_text()) == report  # deterministic


def test_limit_scores_the_first_items(run, tmp_path):
    assert _cli("--model", str(run["ckpt"]), "--tasks", f"mmlu:{run['files']['mmlu']},bpb:{run['data']}",
                "--limit", "2", "--json", str(tmp_path / "e.json")) == 0
    t = json.loads((tmp_path / "e.json").read_text())["tasks"]
    assert (t["mmlu"]["items"], t["bpb"]["items"]) == (2, 2)


@pytest.mark.parametrize("tasks,says", [
    ("squad:{mmlu}", "unknown kind 'squad'"),
    ("mmlu:{missing}", "no such file or folder"),
    ("mmlu", "a task is [NAME=]KIND:PATH"),
    ("gsm8k:{mmlu}", "field 'answer': a non-empty string is needed"),
])
def test_a_bad_task_is_one_line_and_exit_2(run, tmp_path, capsys, tasks, says):
    spec = tasks.format(mmlu=run["files"]["mmlu"], missing=tmp_path / "nope.jsonl")
    assert _cli("--model", str(run["ckpt"]), "--tasks", spec) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and says in err, err


def test_a_job_without_a_decontaminate_stage_or_a_model_that_is_none_is_exit_2(run, tmp_path, capsys):
    job = _job(tmp_path / "job", [], stage="02-exact_dedup")
    assert _cli("--model", str(run["ckpt"]), "--tasks", f"mmlu:{run['files']['mmlu']}", "--job", job) == 2
    assert "no decontaminate stage" in capsys.readouterr().err
    assert _cli("--model", str(tmp_path), "--tasks", f"mmlu:{run['files']['mmlu']}") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a checkpoint" in err
