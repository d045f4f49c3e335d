"""Tokenization with HF ``tokenizers``: train a byte-level BPE on the job's own corpus, or load one.

Byte-level BPE with no normalizer decodes back to exactly the input text, which is what lets
``tokenmill inspect`` prove a round trip. BOS/EOS handling is explicit (spec) and recorded in the
manifest; SFT documents are encoded segment by segment so the loss mask falls on token boundaries.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pipeline import storage
from pipeline.fast.byte_level_bpe import FastByteLevelBPE
from pipeline.spec import TokenizerSpec


class TokenizerError(ValueError):
    pass


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int, special: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


@dataclass(frozen=True)
class TokenizerInfo:
    """The ids the packer and the manifest need, resolved once from a tokenizer and the spec."""

    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    pad_id: int
    add_bos: bool
    add_eos: bool
    sha256: str

    @classmethod
    def resolve(cls, tok: Tokenizer, spec: TokenizerSpec) -> TokenizerInfo:
        def token_id(token: str, needed: bool, what: str) -> int | None:
            tid = tok.token_to_id(token)
            if tid is None and needed:
                raise TokenizerError(f"tokenizer.{what}: token {token!r} is not in the tokenizer's vocabulary")
            return tid

        bos = token_id(spec.bos_token, spec.add_bos, "bos_token")
        eos = token_id(spec.eos_token, spec.add_eos, "eos_token")
        pad = tok.token_to_id(spec.pad_token)
        if pad is None:
            pad = eos if eos is not None else 0
        return cls(
            # ids, not a count: a loaded tokenizer may place added tokens at sparse, high ids
            vocab_size=max(tok.get_vocab(with_added_tokens=True).values()) + 1,
            bos_id=bos,
            eos_id=eos,
            pad_id=pad,
            add_bos=spec.add_bos,
            add_eos=spec.add_eos,
            sha256=tokenizer_hash(tok),
        )


def tokenizer_hash(tok: Tokenizer) -> str:
    return hashlib.sha256(tok.to_str().encode()).hexdigest()


def special_tokens(spec: TokenizerSpec) -> list[str]:
    return list(dict.fromkeys([spec.eos_token, spec.pad_token, spec.bos_token]))


def load_tokenizer(path: str) -> Tokenizer:
    try:
        if "://" in path:  # an object store (the storage layer); a local file is read by tokenizers itself
            return Tokenizer.from_str(storage.read_text(path))
        return Tokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises a bare Exception for a bad file
        raise TokenizerError(f"tokenizer.path: cannot load {path}: {exc}") from None


class DocEncoder:
    """Encode a batch of documents into (ids, mask) with BOS/EOS as the spec says."""

    def __init__(self, tok: Tokenizer, info: TokenizerInfo, fast: bool = True):
        self.tok = tok
        # A document that contains the literal text of a special token ("<|endoftext|>") must not
        # turn into that token: encode it as plain text; only the packer adds BOS/EOS.
        self.tok.encode_special_tokens = True
        self.info = info
        # BOS/EOS as one-element arrays, made once (a document's ids are wrapped with them in one concatenate)
        self._bos = np.array([info.bos_id], np.int32) if info.add_bos and info.bos_id is not None else None
        self._eos = np.array([info.eos_id], np.int32) if info.add_eos and info.eos_id is not None else None
        # the same ids as encode_batch_fast, several times faster (pipeline/fast/byte_level_bpe.py); None: HF itself
        self._fast = FastByteLevelBPE(tok) if fast and FastByteLevelBPE.supports(tok) else None

    def ids(self, texts: list[str]) -> list[np.ndarray]:
        """int32 token ids of each text, without BOS/EOS."""
        if self._fast is not None:
            return self._fast.encode_batch(texts)
        return [np.asarray(e.ids, dtype=np.int32) for e in self.tok.encode_batch_fast(texts, add_special_tokens=False)]

    def encode(self, texts: list[str], segments: list[str | None]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        plain = [i for i, s in enumerate(segments) if not s]
        out: list[tuple[np.ndarray, np.ndarray | None] | None] = [None] * len(texts)
        if plain:
            for i, ids in zip(plain, self.ids([texts[i] for i in plain]), strict=True):
                out[i] = (self._wrap(ids), None)
        for i, seg in enumerate(segments):
            if seg:
                out[i] = self._encode_segments(json.loads(seg))
        return cast(list[tuple[np.ndarray, np.ndarray | None]], out)  # every place filled: plain or segments

    def _wrap(self, ids: np.ndarray) -> np.ndarray:
        bos, eos = self._bos, self._eos
        if bos is None:
            return ids if eos is None else np.concatenate((ids, eos))
        return np.concatenate((bos, ids) if eos is None else (bos, ids, eos))

    def _encode_segments(self, segments: list[list]) -> tuple[np.ndarray, np.ndarray]:
        ids = self.ids([t for t, _ in segments])
        masks = [np.full(len(x), 1 if train else 0, np.uint8) for x, (_, train) in zip(ids, segments, strict=True)]
        if self.info.add_bos and self.info.bos_id is not None:
            ids.insert(0, np.array([self.info.bos_id], np.int32))
            masks.insert(0, np.zeros(1, np.uint8))
        if self.info.add_eos and self.info.eos_id is not None:
            ids.append(np.array([self.info.eos_id], np.int32))
            masks.append(np.ones(1, np.uint8))  # the model learns to stop after the response
        return np.concatenate(ids), np.concatenate(masks)
