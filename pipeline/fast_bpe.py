"""Byte-level BPE encoding with the exact ids of HF ``tokenizers``, at several times its speed.

Why: ``Tokenizer.encode_batch_fast`` spends most of its time allocating (a NormalizedString with
per-byte alignments for every pre-token, a String per token, offsets, masks) rather than merging;
on one core it tokenizes ~1.5 MB/s, which made tokenization the largest part of a job. Text is made
of few distinct pre-tokens (words with their leading space, runs of digits, punctuation, whitespace),
so this encoder splits a document with the same GPT-2 pattern (the ``regex`` module), looks each
pre-token up in a dict of the ids it encodes to, and asks the tokenizer's own BPE model
(``model.tokenize``, exactly what ``encode`` runs on each pre-token) only for pre-tokens not seen yet.

Same output by construction, checked where it could differ:

* only a tokenizer whose pipeline is exactly "no normalizer, ByteLevel(add_prefix_space=False,
  use_regex=True), special added tokens only (left in the text: ``encode_special_tokens``), no
  truncation/padding" is handled (:meth:`FastByteLevelBPE.supports`); any other goes through HF;
* the split depends on each character's membership in ``\\p{L}``, ``\\p{N}`` and ``\\s``, and
  Oniguruma (inside ``tokenizers``) and ``regex`` ship different Unicode versions. So every
  character is checked once per process against HF's own pre-tokenizer (ASCII up front, other
  characters when a document first contains them); a document holding a character whose split
  differs is encoded by HF instead.
"""

from __future__ import annotations

import json
import re
from array import array
from itertools import islice
from typing import Any

import numpy as np
import regex

#: the pre-tokenizer pattern of ``pre_tokenizers.ByteLevel(use_regex=True)`` (GPT-2's)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_WS = r"\t\n\x0b\x0c\r "
#: the same on ASCII text, for the standard ``re`` (twice as fast as ``regex`` with Unicode classes)
ASCII_PATTERN = rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_WS}A-Za-z0-9]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+"""
#: cached pre-tokens per process (~150 bytes each); past it the older half is dropped. A corpus of a few hundred
#: MB has ~1M distinct pre-tokens: a smaller cache would be refilled, at ~6 us a pre-token, again and again
MAX_CACHE = 1 << 20


def byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (what ``ByteLevel`` maps each UTF-8 byte to)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def _probe(c: str) -> str:
    """``c`` in every context the pattern distinguishes: after a letter, a digit, punctuation, spaces,
    an apostrophe, repeated, and before the same."""
    return f"a{c}b {c}{c} 1{c}2 .{c}\t{c}\n{c}'{c} x{c}{c}{c}  {c} {c}. \t{c}\n\n"


class _PieceIds(dict):
    """pre-token -> its ids as int32 bytes; a miss asks the BPE model."""

    def __init__(self, model: Any, table: list[str]):
        super().__init__()
        self.model, self.table = model, table

    def __missing__(self, piece: str) -> bytes:
        if len(self) >= MAX_CACHE:  # keep the newer half (a dict keeps insertion order)
            for old in list(islice(self, len(self) // 2)):
                del self[old]
        mapped = "".join([self.table[b] for b in piece.encode("utf-8")])
        ids = array("i", [t.id for t in self.model.tokenize(mapped)]).tobytes()
        self[piece] = ids
        return ids


class FastByteLevelBPE:
    """Encode texts as ``tok.encode_batch_fast(texts, add_special_tokens=False)`` would (ids only)."""

    def __init__(self, tok: Any):
        self.tok = tok
        self._split = regex.compile(GPT2_PATTERN).findall
        self._table = byte_chars()
        self._ids = _PieceIds(tok.model, self._table)
        self._char_ok: dict[str, bool] = {}
        self._split_ascii = re.compile(ASCII_PATTERN).findall
        self._ascii_ok = all(self._same_split(_probe(chr(c)), self._split_ascii) for c in range(128))
        self.fallback_docs = 0

    @staticmethod
    def supports(tok: Any) -> bool:
        """True when the tokenizer's pipeline is the one this class reproduces (see the module docstring)."""
        try:
            cfg = json.loads(tok.to_str())
        except Exception:  # noqa: BLE001 - an unusual tokenizer: leave it to HF
            return False
        pre = cfg.get("pre_tokenizer") or {}
        post = cfg.get("post_processor")
        return (
            cfg.get("normalizer") is None
            and pre.get("type") == "ByteLevel" and pre.get("add_prefix_space") is False
            and pre.get("use_regex", True) is True
            and (post is None or post.get("type") == "ByteLevel")
            and cfg.get("truncation") is None and cfg.get("padding") is None
            and (cfg.get("model") or {}).get("type") == "BPE" and (cfg.get("model") or {}).get("dropout") is None
            and all(t.get("special") for t in cfg.get("added_tokens") or [])
            and bool(getattr(tok, "encode_special_tokens", False) or not cfg.get("added_tokens"))
        )

    def _same_split(self, text: str, split: Any) -> bool:
        """Whether ``split`` cuts ``text`` into the pre-tokens HF's pre-tokenizer makes."""
        try:
            mine = ["".join([self._table[b] for b in p.encode("utf-8")]) for p in split(text)]
            return mine == [p for p, _ in self.tok.pre_tokenizer.pre_tokenize_str(text)]
        except Exception:  # noqa: BLE001 - e.g. a lone surrogate: HF decides (and reports) what happens
            return False

    def _check(self, c: str) -> bool:
        """Whether ``c`` splits as in HF in every context (memoized per character)."""
        ok = self._char_ok.get(c)
        if ok is None:
            ok = self._char_ok[c] = self._same_split(_probe(c), self._split)
        return ok

    def _ids_of(self, pieces: list[str]) -> np.ndarray:
        return np.frombuffer(b"".join(map(self._ids.__getitem__, pieces)), dtype=np.int32)

    def encode(self, text: str) -> np.ndarray | None:
        """int32 ids of ``text``, or None when a character of it may split otherwise than in HF."""
        if text.isascii() and self._ascii_ok:
            return self._ids_of(self._split_ascii(text))
        ok = self._char_ok
        if all(ok[c] if c in ok else self._check(c) for c in set(text)):
            return self._ids_of(self._split(text))
        return None

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """int32 ids of each text; texts this class cannot vouch for go through HF in one batch."""
        out: list[np.ndarray | None] = [self.encode(t) for t in texts]
        rest = [i for i, ids in enumerate(out) if ids is None]
        if rest:
            self.fallback_docs += len(rest)
            encs = self.tok.encode_batch_fast([texts[i] for i in rest], add_special_tokens=False)
            for i, enc in zip(rest, encs, strict=True):
                out[i] = np.asarray(enc.ids, dtype=np.int32)
        return out  # type: ignore[return-value]
