"""Byte-level BPE encoding with the exact ids of HF ``tokenizers``, without its allocations.

**Must equal** ``Tokenizer.encode_batch_fast(texts, add_special_tokens=False)`` of HF ``tokenizers``
(``tokenizers>=0.20``), id for id. **Fallback**: ``tokenizers`` itself (:meth:`FastByteLevelBPE.encode_batch` hands it
the documents it cannot vouch for; :mod:`pipeline.tokenize` uses it for every other tokenizer). **Steps aside** for
a tokenizer whose pipeline is not the one reproduced here (:meth:`FastByteLevelBPE.supports`), and per document
for a character whose split may differ (below). **Difference test**: ``tests/test_fast_bpe.py``; bench:
``bench/tokenize_write.py``.

Why: ``Tokenizer.encode_batch_fast`` spends most of its time allocating (a NormalizedString with
per-byte alignments for every pre-token, a String per token, offsets, masks) rather than merging,
which made tokenization the largest part of a job. Text is made
of few distinct pre-tokens (words with their leading space, runs of digits, punctuation, whitespace),
so this encoder looks whole space-separated chunks up in a dict of the ids they encode to; a chunk not
seen yet is split with the same GPT-2 pattern (the ``regex`` module), each of its pre-tokens looked up in a
second dict, and the tokenizer's own BPE model (``model.tokenize``, exactly what ``encode`` runs on each
pre-token) is asked only for pre-tokens not seen yet.

Why chunks: splitting with the pattern costs more than everything else (one Python string per
pre-token), while ``str.split(" ")`` runs in C. A space followed by a character that is not whitespace
always starts a pre-token (`` ?\\p{L}+``, `` ?\\p{N}+`` or `` ?[^\\s\\p{L}\\p{N}]+``), no pre-token ends
after it, and the pattern looks ahead but never behind: so the pre-tokens of a text are those of its
chunks, each split on its own, when the text is cut just before every such space. A text with a space
before whitespace or at its end is cut only at the spaces that qualify, never at the others
(:func:`kernels.space_chunks.space_chunks`, one pass in C).

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
from collections.abc import Iterable
from itertools import islice
from typing import Any

import numpy as np
import regex

from kernels.space_chunks import space_chunks

#: the pre-tokenizer pattern of ``pre_tokenizers.ByteLevel(use_regex=True)`` (GPT-2's)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_WS = r"\t\n\x0b\x0c\r "
#: the same on ASCII text, for the standard ``re`` (twice as fast as ``regex`` with Unicode classes)
ASCII_PATTERN = rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_WS}A-Za-z0-9]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+"""
#: cached pre-tokens per process (~150 bytes each); past it the older half is dropped. A corpus of a few hundred
#: MB has ~1M distinct pre-tokens: a smaller cache would be refilled, one merge loop a pre-token, again and again
MAX_CACHE = 1 << 20
#: cached chunks per process (~130 bytes each): a few hundred MB of text per worker has ~1.5M distinct ones
MAX_CHUNKS = 1 << 21


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
        self.model = model
        self.bytes_to_chars = str.maketrans({chr(b): c for b, c in enumerate(table)})  # on latin-1 text

    def __missing__(self, piece: str) -> bytes:
        if len(self) >= MAX_CACHE:  # keep the newer half (a dict keeps insertion order)
            for old in list(islice(self, len(self) // 2)):
                del self[old]
        mapped = piece.encode("utf-8").decode("latin-1").translate(self.bytes_to_chars)
        ids = array("i", [t.id for t in self.model.tokenize(mapped)]).tobytes()
        self[piece] = ids
        return ids


class _ChunkIds(dict):
    """chunk (the text after its leading space) -> its ids as int32 bytes; a miss splits ``" " + chunk``
    into pre-tokens (one, when the chunk is all letters: `` ?\\p{L}+``) and looks each up."""

    def __init__(self, ids_of_piece: _PieceIds, split: Any, split_ascii: Any | None):
        super().__init__()
        self.piece, self.split, self.split_ascii = ids_of_piece, split, split_ascii

    def ids(self, text: str) -> bytes:
        """The ids of ``text`` split on its own."""
        split = self.split_ascii if self.split_ascii is not None and text.isascii() else self.split
        return b"".join(map(self.piece.__getitem__, split(text)))

    def __missing__(self, chunk: str) -> bytes:
        if len(self) >= MAX_CHUNKS:  # keep the newer half (a dict keeps insertion order)
            for old in list(islice(self, len(self) // 2)):
                del self[old]
        ids = self[chunk] = self.piece[" " + chunk] if chunk.isalpha() else self.ids(" " + chunk)
        return ids


class FastByteLevelBPE:
    """Encode texts as ``tok.encode_batch_fast(texts, add_special_tokens=False)`` would (ids only)."""

    def __init__(self, tok: Any):
        self.tok = tok
        self._split = regex.compile(GPT2_PATTERN).findall
        self._table = byte_chars()
        self._ids = _PieceIds(tok.model, self._table)
        self._good: set[str] = set()  # characters checked: they split as in HF
        self._bad: set[str] = set()  # characters checked: they may not
        self._checked_pattern(())
        self._split_ascii = re.compile(ASCII_PATTERN).findall
        self._ascii_ok = all(self._same_split(_probe(chr(c)), self._split_ascii) for c in range(128))
        self._chunks = _ChunkIds(self._ids, self._split, self._split_ascii if self._ascii_ok else None)
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

    def _chars_ok(self, chars: set[str]) -> bool:
        """Whether every character of ``chars`` splits as in HF in every context (each checked once per
        process; a set difference in C decides for the characters already seen)."""
        new = chars - self._good
        if not new:
            return True
        if not new.isdisjoint(self._bad):
            return False
        for c in new:
            (self._good if self._same_split(_probe(c), self._split) else self._bad).add(c)
        return new.isdisjoint(self._bad)

    def _checked_pattern(self, good: Iterable[str]) -> None:
        """``self._unchecked(text)``: a match when ``text`` holds a character outside ``good`` (a snapshot of the
        characters known to split as in HF), found by one scan in C instead of building the text's set."""
        chars = sorted(good)
        # no snapshot yet: every character is unchecked
        self._unchecked = re.compile(f"[^{''.join(map(re.escape, chars))}]" if chars else r"[\s\S]").search
        self._snapshot, self._slow_since = len(chars), 0

    def _text_ok(self, text: str) -> bool:
        """Whether every character of ``text`` splits as in HF (:meth:`_chars_ok`, asked only when the scan finds
        a character the last snapshot did not hold; the snapshot is renewed as the checked characters grow)."""
        if self._unchecked(text) is None:
            return True
        ok = self._chars_ok(set(text))
        self._slow_since += 1
        grown = len(self._good) - self._snapshot
        if grown and (grown * 8 >= self._snapshot or self._slow_since >= 256):
            self._checked_pattern(self._good)
        return ok

    def _chunks_of(self, text: str) -> list[str] | None:
        """The text cut into chunks (module docstring), or None when a character of it may split otherwise
        than in HF."""
        if not (text.isascii() and self._ascii_ok) and not self._text_ok(text):
            return None
        return space_chunks(text)

    def _ids_of(self, chunks: list[str]) -> np.ndarray:
        """The ids of a text's chunks: the first as it is, the others after a space."""
        first = self._chunks.ids(chunks[0]) if chunks[0] else b""
        return np.frombuffer(first + b"".join(map(self._chunks.__getitem__, islice(chunks, 1, None))),
                             dtype=np.int32)

    def encode(self, text: str) -> np.ndarray | None:
        """int32 ids of ``text``, or None when a character of it may split otherwise than in HF."""
        chunks = self._chunks_of(text)
        return None if chunks is None else self._ids_of(chunks)

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
