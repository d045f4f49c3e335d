"""Instruction data end to end: the pipeline packs {instruction, input, output} and chat records with
``loss_mask`` 0 exactly on the prompt tokens, the loader turns that into labels, and a few training
steps lower the loss, which is measured on response tokens only."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from pipeline.job.engine import run_job
from pipeline.readers.templates import render
from pipeline.shard_format import Manifest, iter_tar_samples
from pipeline.spec import parse_spec
from tests.corpus_fixtures import WORDS, write_jsonl
from training.data import IGNORE_INDEX, ShardLoader

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[1]


def _records(n: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    instr, chat = [], []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
        instr.append({"id": f"i-{i}", "instruction": "Repeat the words.", "input": " ".join(words) if i % 2 else "",
                      "output": " ".join(reversed(words)) if i % 2 else "Nothing to repeat."})
        chat.append({"id": f"c-{i}", "messages": [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": f"First word of: {' '.join(words)}?"},
            {"role": "assistant", "content": words[0]},
        ]})
    return instr, chat


@pytest.fixture(scope="module")
def sft(ray_shared, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sft")
    instr, chat = _records(160)
    write_jsonl(folder / "instr" / "a.jsonl", instr)
    write_jsonl(folder / "chat" / "b.jsonl", chat)
    out = tmp_path_factory.mktemp("sft-shards")
    spec = parse_spec({
        "name": "sft-test",
        "inputs": [{"path": str(folder / "instr"), "format": "instruction"},
                   {"path": str(folder / "chat"), "format": "chat"}],
        "tokenizer": {"train": {"vocab_size": 300, "sample_docs": 400}},
        "packing": {"seq_len": 128},
        "output": {"path": str(out), "samples_per_shard": 8, "overwrite": True},
        "execution": {"batch_size": 64},
    })
    run_job(spec)
    records = {r["id"]: (r, "instruction") for r in instr} | {r["id"]: (r, "chat") for r in chat}
    return out, records


def _samples(out: Path):
    m = Manifest.load(out)
    for shard in m.shards:
        with open(out / shard.name, "rb") as f:
            yield from iter_tar_samples(f)


def test_loss_mask_is_zero_exactly_on_prompt_tokens(sft):
    out, records = sft
    m = Manifest.load(out)
    assert m.has_loss_mask and m.eos_id is not None
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.encode_special_tokens = True
    checked = 0
    for sample in _samples(out):
        starts = np.concatenate([[0], np.cumsum(sample.doc_lens)])
        for doc_id, a, b in zip(sample.meta["doc_ids"], starts[:-1], starts[1:], strict=True):
            record, fmt = records[doc_id]
            want_ids, want_mask = [], []
            for text, train in render(record, fmt):
                ids = tok.encode(text, add_special_tokens=False).ids
                want_ids += ids
                want_mask += [int(train)] * len(ids)
            want_ids.append(m.eos_id)
            want_mask.append(1)  # the model learns to stop after the response
            assert sample.input_ids[a:b].tolist() == want_ids, doc_id
            assert sample.loss_mask[a:b].tolist() == want_mask, doc_id
            checked += 1
    assert checked == len(records)


def test_labels_carry_loss_only_on_response_tokens(sft):
    out, _ = sft
    batch = next(iter(ShardLoader(str(out), 4, num_workers=0, shuffle=False)))
    samples = list(_samples(out))[:4]
    for row, sample in enumerate(samples):
        n = len(sample.input_ids)
        ends = set((np.cumsum(sample.doc_lens) - 1).tolist())
        want = [t for t in range(n - 1) if t not in ends and sample.loss_mask[t + 1] == 1]
        got = (batch["labels"][row] != IGNORE_INDEX).nonzero().flatten().tolist()
        assert got == want


def test_a_few_steps_lower_the_response_loss(sft, tmp_path):
    out, _ = sft
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "training.train", "--config", str(REPO / "training/configs/tiny.yaml"),
           "--data", str(out), "--out", str(run), "--max-steps", "20", "--set", "data.num_workers=0",
           "--set", "parallel.precision=fp32"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # the trainer counted exactly the response-token labels of its first batch
    first = next(iter(ShardLoader(str(out), 4, num_workers=0, seed=0, shuffle_window=256)))
    assert rows[0]["loss_tokens"] == int((first["labels"] != IGNORE_INDEX).sum())
    assert rows[0]["loss_tokens"] < first["tokens"] * 0.6  # prompts carry no loss
    head = np.mean([r["loss"] for r in rows[:3]])
    tail = np.mean([r["loss"] for r in rows[-3:]])
    assert tail < head - 1.0, (head, tail)
