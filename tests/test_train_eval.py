"""Validation loss in the trainer (issue 40): the logged ``val_loss`` / ``val_bpb`` equal a by-hand computation.

A tiny Llama (random init, fixed seed, fp32) trains a few steps on a synthetic shard set whose token ids come
from a small byte-level BPE; the validation set has documents of uneven lengths, a ``loss_mask`` and a short
last batch. The by-hand side shares no code with ``training.scoring``: it runs the checkpoint's model on each
document alone (no packing, no document mask needed), takes log-softmax by hand, and counts bytes with the
tokenizer's own ``decode``. Runs in process (one rank) except one 2-rank torchrun, whose figures must be
the same sums over the same batches.
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from kernels.attention import DocMask
from pipeline.output.shard_set import write_shard_set
from pipeline.shard_format import Manifest
from pipeline.tokenize import train_bpe
from tests.test_loader_dist import REPO, torchrun
from training import train
from training.checkpoint import CheckpointError
from training.config import ConfigError, load_config
from training.parallel import DistInfo
from training.scoring import model_from_checkpoint
from training.synthetic import SYNTHETIC, random_packed
from training.token_bytes import token_byte_lengths
from training.validate import Validator, eval_location

CONFIG = REPO / "training" / "configs" / "tiny.yaml"
SEQ, STEPS, VAL_SAMPLES = 32, 3, 11  # 11 validation sequences in batches of 4: 4 + 4 + 3
TEXTS = ["the quick brown fox jumps over the lazy dog. ", "def add(a, b):\n    return a + b\n",
         "Curation you can prove: a validation split and an evaluation harness. "] * 30


def _tokenizer(folder: Path) -> Tokenizer:
    tok = train_bpe(TEXTS, 200, 1, ["<|endoftext|>"])
    tok.save(str(folder / "tokenizer.json"))
    return tok


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A training set and a validation set (with loss masks) of the same tokenizer, and the sequences written."""
    root = tmp_path_factory.mktemp("eval-data")
    tok = _tokenizer(root)
    vocab = tok.get_vocab_size()
    write_shard_set(root, random_packed(24, SEQ, vocab, seed=1), seq_len=SEQ, vocab_size=vocab,
                    samples_per_shard=8, **SYNTHETIC)
    # ids whose text decode shows whole (not a lone byte of a multi-byte character, which decodes to U+FFFD),
    # so that decode counts their bytes; the special token stays in: it counts 0 bytes
    clean = np.array([i for i in range(vocab) if "\ufffd" not in tok.decode([i])])
    val = [(clean[ids], lens, mask)
           for ids, lens, mask in random_packed(VAL_SAMPLES, SEQ, len(clean), seed=2, max_doc=12, with_mask=True)]
    write_shard_set(root / "validation", iter(val), seq_len=SEQ, vocab_size=vocab, samples_per_shard=5,
                    **SYNTHETIC)
    return {"train": root, "validation": root / "validation", "sequences": val, "tokenizer": tok}


def _run(data: dict[str, Any], out: Path, *extra: str) -> int:
    """One in-process rank of ``tokenmill train`` (fp32, eval every 2 steps on the validation set)."""
    handler = signal.getsignal(signal.SIGTERM)
    try:
        return train.main(["--config", str(CONFIG), "--data", str(data["train"]), "--out", str(out),
                           "--max-steps", str(STEPS), *_settings(data), *extra])
    finally:
        signal.signal(signal.SIGTERM, handler)


def _settings(data: dict[str, Any]) -> list[str]:
    return ["--set", "parallel.precision=fp32", "--set", "data.num_workers=0", "--set", "eval.every=2",
            "--set", f"eval.data={json.dumps(str(data['validation']))}"]


def _eval_lines(out: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "val_loss" in r]


def by_hand(model: torch.nn.Module, sequences: list, tok: Tokenizer, limit: int | None = None) -> tuple[float, float]:
    """(mean nats per target token, bits per byte) over every document of every sequence, one document at a time."""
    nll, tokens, nbytes = 0.0, 0, 0
    special = {tok.token_to_id("<|endoftext|>")}
    with torch.no_grad():
        for ids, lens, mask in sequences[:limit]:
            start = 0
            for n in (int(x) for x in lens):
                doc = torch.as_tensor(ids[start:start + n], dtype=torch.long)
                keep = np.ones(n, bool) if mask is None else np.asarray(mask[start:start + n]) == 1
                start += n
                one = DocMask.from_segment_lengths(torch.tensor([n]), 1, n)
                logits = model(doc[None], torch.arange(n)[None], one)[0].double()
                for t in range(n - 1):
                    if not keep[t + 1]:
                        continue
                    row = logits[t]
                    shifted = row - row.max()
                    log_prob = shifted[doc[t + 1]] - math.log(float(shifted.exp().sum()))
                    nll -= float(log_prob)
                    tokens += 1
                    target = int(doc[t + 1])
                    nbytes += 0 if target in special else len(tok.decode([target]).encode())
    return nll / tokens, nll / math.log(2) / nbytes


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-5 * abs(b)


@pytest.fixture(scope="module")
def one_rank(data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run-1")
    assert _run(data, out) == 0
    return out


def test_val_loss_and_bpb_equal_a_by_hand_computation(data: dict[str, Any], one_rank: Path) -> None:
    lines = _eval_lines(one_rank)
    assert [r["step"] for r in lines] == [2, STEPS]  # every 2 steps, and once at the end
    final = lines[-1]
    ckpt = one_rank / "checkpoints" / f"step-{STEPS:08d}"
    model, _, tokenizer = model_from_checkpoint(ckpt)
    assert tokenizer == str(data["train"] / "tokenizer.json")  # the run's data names it
    loss, bpb = by_hand(model.float(), data["sequences"], data["tokenizer"])
    assert _close(final["val_loss"], loss), (final["val_loss"], loss)
    assert _close(final["val_bpb"], bpb), (final["val_bpb"], bpb)


def test_eval_is_deterministic_and_kept_in_the_checkpoint(data: dict[str, Any], one_rank: Path, tmp_path: Path) -> None:
    assert _run(data, tmp_path) == 0
    strip = [{k: v for k, v in r.items() if k != "val_s"} for r in _eval_lines(one_rank)]
    assert strip == [{k: v for k, v in r.items() if k != "val_s"} for r in _eval_lines(tmp_path)]
    kept = json.loads((tmp_path / "checkpoints" / f"step-{STEPS:08d}" / "trainer.json").read_text())["eval"]
    assert kept["step"] == STEPS
    assert (kept["val_loss"], kept["val_bpb"]) == (strip[-1]["val_loss"], strip[-1]["val_bpb"])


def test_max_batches_scores_the_first_batches_in_order(data: dict[str, Any], tmp_path: Path) -> None:
    assert _run(data, tmp_path, "--set", "eval.max_batches=1") == 0
    final = _eval_lines(tmp_path)[-1]
    model, _, _ = model_from_checkpoint(tmp_path / "checkpoints" / f"step-{STEPS:08d}")
    loss, _ = by_hand(model.float(), data["sequences"], data["tokenizer"], limit=4)  # data.batch_size 4
    assert _close(final["val_loss"], loss)


def test_two_ranks_give_the_by_hand_figures(data: dict[str, Any], tmp_path: Path) -> None:
    """Each rank scores a share (3 batches: 2 and 1 plus a filler pass) and the sums are all-reduced."""
    proc = torchrun(2, ["-m", "training.train", "--config", str(CONFIG), "--data", str(data["train"]),
                        "--out", str(tmp_path), "--max-steps", str(STEPS), *_settings(data)], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = _eval_lines(tmp_path)[-1]
    model, _, _ = model_from_checkpoint(tmp_path / "checkpoints" / f"step-{STEPS:08d}")
    loss, bpb = by_hand(model.float(), data["sequences"], data["tokenizer"])
    assert _close(final["val_loss"], loss) and _close(final["val_bpb"], bpb), (final, loss, bpb)


def test_token_byte_lengths_match_decode_and_sum_to_the_text(tmp_path: Path) -> None:
    texts = ["naïve café, 日本語 and 🙂 emoji; ", "plain ascii words here. "] * 20
    tok = train_bpe(texts, 300, 1, ["<|endoftext|>", "<|pad|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    lengths = token_byte_lengths(tmp_path / "tokenizer.json")
    assert len(lengths) == tok.get_vocab_size()
    assert lengths[tok.token_to_id("<|endoftext|>")] == 0 and lengths[tok.token_to_id("<|pad|>")] == 0
    whole = [i for i in range(len(lengths)) if i > 1 and "\ufffd" not in tok.decode([i])]
    assert len(whole) > 100
    assert all(lengths[i] == len(tok.decode([i]).encode()) for i in whole)
    for text in texts[:2] + ["unseen: Ωmega ∑ 🙂🙂 ß"]:
        assert int(lengths[tok.encode(text, add_special_tokens=False).ids].sum()) == len(text.encode())


def test_default_eval_data_is_the_validation_split_the_manifest_names(data: dict[str, Any],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(CONFIG, [f"data.path={json.dumps(str(data['train']))}", "eval.every=5"])
    manifest = Manifest.load(data["train"])
    assert eval_location(cfg, manifest, 0) is None
    assert "eval: off" in capsys.readouterr().err
    manifest.validation = {"path": "validation", "documents": 3, "samples": VAL_SAMPLES, "tokens": 1}
    assert eval_location(cfg, manifest, 0) == str(data["train"] / "validation")
    off = load_config(CONFIG, [f"data.path={json.dumps(str(data['train']))}"])
    assert eval_location(off, manifest, 0) is None


def test_a_validation_set_of_another_tokenizer_is_refused(data: dict[str, Any], tmp_path: Path) -> None:
    other = tmp_path / "other"
    write_shard_set(other, random_packed(3, SEQ, 50), seq_len=SEQ, vocab_size=50, samples_per_shard=3,
                    **{**SYNTHETIC, "tokenizer_hash": "another"})
    cfg = load_config(CONFIG, [f"data.path={json.dumps(str(data['train']))}", "eval.every=1",
                               f"eval.data={json.dumps(str(other))}"])
    info = DistInfo(0, 1, 0, torch.device("cpu"))
    with pytest.raises(ConfigError, match="^eval.data: .* another tokenizer"):
        Validator.open(cfg, info, Manifest.load(data["train"]), 64, SEQ)


def test_a_deepspeed_checkpoint_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "trainer.json").write_text(json.dumps({"step": 1, "strategy": "deepspeed", "model": {}}))
    with pytest.raises(CheckpointError, match="DeepSpeed checkpoint: loading one for evaluation is not supported"):
        model_from_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no trainer.json"):
        model_from_checkpoint(tmp_path / "missing")
