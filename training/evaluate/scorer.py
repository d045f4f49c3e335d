"""The log-likelihood of a target text given a context, with the trainer's loss (:mod:`.rows`).

A request is one document of a batch: the context's tokens carry ``loss_mask`` 0 and the target's 1, so its
score is the summed negative log-probability of each target token given everything before it, what the trainer
minimizes. A sequence longer than the model's ``max_seq_len`` is scored in windows (:func:`windows`): each
target token is predicted once, from at least ``min_context`` tokens before it where the sequence has them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from pipeline.shard_format import MANIFEST, Sample
from training.checkpoint import TRAINER, CheckpointError, latest_checkpoint
from training.data import collate
from training.evaluate.rows import Score, row_scores
from training.model import Llama, ModelConfig
from training.scoring import model_from_checkpoint
from training.token_bytes import TokenBytesError, token_byte_lengths

#: sequences are padded to a multiple of this many tokens
PAD_TO = 32
#: tokens (rows times padded length) run through the model at once
BATCH_TOKENS = 4096


class EvalError(ValueError):
    """What the user gave cannot be evaluated (exit 2); the message names it and why."""


def windows(n: int, context: int, max_len: int, min_context: int) -> list[tuple[int, int, int]]:
    """``(start, end, first_target)`` of each window over a sequence of ``n`` tokens whose targets are positions
    ``context..n-1`` (``context`` >= 1): each window holds at most ``max_len`` tokens and scores targets
    ``first_target..end-1``, each with at least ``min_context`` tokens before it in the window (all there are
    near the start)."""
    out = []
    p = context
    while p < n:
        end = min(n, max(max_len, p + max_len - min_context))
        out.append((max(0, end - max_len), end, p))
        p = end
    return out


def padded_length(n: int, max_len: int) -> int:
    """``n`` rounded up to a multiple of :data:`PAD_TO` (at most ``max_len``): the padding is a segment of its own
    that no target sees, and a few shapes repeat instead of a new one per item, which the CPU kernels set up anew."""
    return min(max_len, PAD_TO * math.ceil(n / PAD_TO)) if n <= max_len else n


@dataclass
class Scorer:
    """A model, its tokenizer and the run's special tokens, scoring targets given contexts."""

    model: Llama
    config: ModelConfig
    tokenizer: Tokenizer
    bos_id: int | None = None
    eos_id: int | None = None
    #: bytes per token id (:func:`training.token_bytes.token_byte_lengths`), None for a tokenizer that is not
    #: byte-level BPE (a target's bytes are then counted from its text)
    token_bytes: torch.Tensor | None = None
    #: the run's shard set's ``tokenizer_hash`` (its manifest), None when unknown
    tokenizer_hash: str | None = None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as the pipeline encodes a document: no special tokens, none read from the text."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def prefix(self) -> list[int]:
        """What starts a document in training: BOS when the run's shard set adds one, else nothing."""
        return [] if self.bos_id is None else [self.bos_id]

    def score(self, context: list[int], target: list[int], min_context: int = 1) -> Score:
        """The target tokens' summed NLL given the context (at least one token)."""
        return self.score_many([(context, target)], min_context)[0]

    def score_many(self, requests: list[tuple[list[int], list[int]]], min_context: int = 1) -> list[Score]:
        """:meth:`score` of each ``(context, target)``, their windows run in batches of up to
        :data:`BATCH_TOKENS` tokens, longest first (so a batch pads little); the same requests give the same
        batches, so the same figures."""
        rows = [(k, *w) for k, w in enumerate(self._windows(requests, min_context))]
        rows.sort(key=lambda r: -len(r[1]))
        totals = [Score(0.0, 0, 0)] * len(requests)
        at = 0
        while at < len(rows):
            length = padded_length(len(rows[at][1]), self.config.max_seq_len)
            chunk = rows[at:at + max(1, BATCH_TOKENS // length)]
            at += len(chunk)
            samples = [Sample(str(k), ids, np.array([len(ids)], dtype=np.int64), mask, {}) for _, ids, mask, k in chunk]
            batch = collate(samples, length, 0, self.config.vocab_size)
            for (_, _, _, k), score in zip(chunk, row_scores(self.model, batch, self.token_bytes), strict=True):
                totals[k] = totals[k] + score
        return totals

    def _windows(self, requests: list[tuple[list[int], list[int]]], min_context: int
                 ) -> list[tuple[np.ndarray, np.ndarray, int]]:
        """``(ids, loss_mask, request)`` of every window of every request."""
        out = []
        for k, (context, target) in enumerate(requests):
            if not context:
                raise ValueError("a target needs at least one context token")
            seq = np.asarray(context + target, dtype=np.int32)
            for start, end, first in windows(len(seq), len(context), self.config.max_seq_len, min_context):
                mask = np.zeros(end - start, dtype=np.uint8)
                mask[first - start:] = 1
                out.append((seq[start:end], mask, k))
        return out


def checkpoint_folder(path: str) -> Path:
    """The checkpoint ``path`` names: a step folder (with ``trainer.json``), or a run's output folder (its latest)."""
    folder = Path(path)
    if (folder / TRAINER).is_file():
        return folder
    latest = latest_checkpoint(folder) if folder.is_dir() else None
    if latest is None:
        raise EvalError(f"--model {path}: not a checkpoint (no {TRAINER}) nor a run folder with checkpoints/")
    return latest


def _run_manifest(tokenizer_path: str) -> dict[str, Any]:
    """The manifest of the shard set beside the tokenizer (BOS and EOS it adds to each document, its tokenizer's
    hash), else nothing."""
    try:
        data = json.loads((Path(tokenizer_path).parent / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _byte_table(tokenizer_path: str, vocab_size: int) -> torch.Tensor | None:
    try:
        lengths = token_byte_lengths(tokenizer_path)
    except TokenBytesError:
        return None
    table = np.zeros(max(vocab_size, len(lengths)), dtype=np.int64)
    table[: len(lengths)] = lengths
    return torch.from_numpy(table)


def load_scorer(model_path: str, tokenizer_path: str | None = None) -> Scorer:
    """The checkpoint's model with the run's tokenizer (``tokenizer_path`` when given)."""
    folder = checkpoint_folder(model_path)
    try:
        model, config, run_tokenizer = model_from_checkpoint(folder)
    except CheckpointError as exc:
        raise EvalError(f"--model: {exc}") from None
    path = tokenizer_path or run_tokenizer
    if path is None:
        raise EvalError(f"--model {model_path}: the run's tokenizer cannot be found (its config.json's data.path "
                        "has no tokenizer.json): pass --tokenizer")
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises a bare Exception for a bad file
        raise EvalError(f"--tokenizer {path}: cannot load: {exc}") from None
    tokenizer.encode_special_tokens = True  # a text holding "<|endoftext|>" is text, as the pipeline encodes it
    if tokenizer.get_vocab_size(with_added_tokens=True) > config.vocab_size:
        raise EvalError(f"--tokenizer {path}: {tokenizer.get_vocab_size()} tokens, more than the model's "
                        f"{config.vocab_size}: not the tokenizer the model was trained with")
    run = _run_manifest(path)
    hash_ = run.get("tokenizer_hash")
    return Scorer(model, config, tokenizer, _int_or_none(run.get("bos_id")), _int_or_none(run.get("eos_id")),
                  _byte_table(path, config.vocab_size), hash_ if isinstance(hash_, str) else None)
