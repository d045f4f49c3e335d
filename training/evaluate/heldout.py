"""Bits per byte of held-out text: a shard set's token sequences, or the documents of a JSONL file.

``bpb = sum(NLL nats) / ln 2 / sum(UTF-8 bytes of the target tokens)`` (:mod:`training.token_bytes`), the figure
the trainer's validation pass logs as ``val_bpb``, and one that compares models whose tokenizers differ.

- A shard set (a folder with ``manifest.json``, e.g. ``OUT/validation``): every sequence in order, each scored as
  the trainer's loss scores it (document boundaries, ``loss_mask``, padding); ``--limit`` sequences.
- JSONL (``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``) of ``{"text": ...}``: each document tokenized with the run's
  tokenizer and wrapped as the run's shard set wraps one (BOS and EOS when it adds them), scored alone (no
  context from another document); one longer than the model's ``max_seq_len`` in windows of that length, each
  starting with the previous one's last token, so every token is predicted once. With BOS, the target bytes are
  the document's UTF-8 bytes; without, its first token is context only and its bytes are not counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pipeline.shard_format import MANIFEST
from training.data import LoaderError, ShardLoader
from training.evaluate.bench import read_records
from training.evaluate.results import ItemResult
from training.evaluate.scorer import EvalError, Scorer
from training.scoring import token_nll


def is_shard_set(path: str) -> bool:
    return "://" in path or (Path(path) / MANIFEST).is_file()


def _byte_table(scorer: Scorer, where: str) -> None:
    if scorer.token_bytes is None:
        raise EvalError(f"{where}: bits per byte of text needs a byte-level BPE tokenizer (each token's exact bytes)")


def text_results(scorer: Scorer, path: str, limit: int | None) -> list[ItemResult]:
    """One result per document of a JSONL file (one of a single token, with no BOS or EOS, has no target)."""
    _byte_table(scorer, f"bpb:{path}")
    suffix = [] if scorer.eos_id is None else [scorer.eos_id]
    records, requests = [], []
    for record in read_records(path, limit):
        ids = scorer.prefix() + scorer.encode(record.text("text")) + suffix
        if len(ids) >= 2:
            records.append(record)
            requests.append((ids[:1], ids[1:]))
    return [ItemResult(r.benchmark, r.id, nll=s.nll, bytes=s.bytes)
            for r, s in zip(records, scorer.score_many(requests), strict=True)]


def _open_shards(scorer: Scorer, path: str) -> ShardLoader:
    try:
        loader = ShardLoader(path, 1, shuffle=False, num_workers=0, max_epochs=1)
    except LoaderError as exc:
        raise EvalError(f"bpb:{path}: {exc}") from None
    m, cfg = loader.manifest, scorer.config
    if scorer.tokenizer_hash is not None and m.tokenizer_hash != scorer.tokenizer_hash:
        raise EvalError(f"bpb:{path}: tokenized with another tokenizer than the model's run "
                        f"({m.tokenizer_hash[:12]} against {scorer.tokenizer_hash[:12]})")
    if m.seq_len > cfg.max_seq_len or m.vocab_size > cfg.vocab_size:
        raise EvalError(f"bpb:{path}: sequences of {m.seq_len} tokens over a vocabulary of {m.vocab_size} do not "
                        f"fit the model (max_seq_len {cfg.max_seq_len}, vocab_size {cfg.vocab_size})")
    return loader


def shard_results(scorer: Scorer, path: str, limit: int | None) -> Iterator[ItemResult]:
    """One result per sequence of a shard set, in the manifest's order."""
    _byte_table(scorer, f"bpb:{path}")
    loader = _open_shards(scorer, path)
    try:
        for n, batch in enumerate(loader.epoch_batches()):
            if limit is not None and n >= limit:
                return
            nll, _, nbytes = token_nll(scorer.model, batch, scorer.token_bytes)
            yield ItemResult(Path(path).name, str(batch["keys"][0]), nll=float(nll), bytes=int(nbytes))
    except LoaderError as exc:
        raise EvalError(f"bpb:{path}: {exc}") from None


def heldout_results(scorer: Scorer, path: str, limit: int | None) -> list[ItemResult]:
    return list(shard_results(scorer, path, limit)) if is_shard_set(path) else text_results(scorer, path, limit)
