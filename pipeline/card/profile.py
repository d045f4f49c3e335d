"""The kept documents' profile, recorded by the write phase for the dataset card.

Every packed range (:func:`pipeline.job.write.pack_range`) adds its documents to a :class:`KeptProfile`:
log2 histograms of characters and tokens per document, documents / bytes / tokens per spec input and per
``meta.lang``, and, on a fixed sample of the documents (``ord % SAMPLE_EVERY == 0``), the words per language
(whitespace-separated), so bytes per token and words per token can be shown per language. It is a few
hundred numbers whatever the corpus size, merged exactly across ranges (sums), so ``stats.json``'s
``profile`` is the same for any parallelism. No Ray, no numpy: it runs inside the range tasks.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

#: one document in this many (by ``ord``) has its words counted
SAMPLE_EVERY = 8
#: the most distinct ``meta.lang`` values profiled (the rest are summed as ``other``)
MAX_LANGUAGES = 256
_LANG_FIELDS = ("docs", "bytes", "tokens", "sample_docs", "sample_bytes", "sample_tokens", "sample_words")
_SOURCE_FIELDS = ("docs", "bytes", "tokens")


def log2_bin(n: int) -> int:
    """The histogram bin of ``n``: 0 holds 0 and 1, bin k holds ``[2**k, 2**(k+1))``."""
    return max(int(n).bit_length() - 1, 0)


def _lang_of(meta: str | None) -> str | None:
    if not meta or '"lang"' not in meta:
        return None
    try:
        value = orjson.loads(meta).get("lang")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


@dataclass
class KeptProfile:
    """Sums over kept documents; ``input_starts`` maps a document's file index (``ord >> 40``) to its input."""

    input_starts: tuple[int, ...] = ()
    chars: dict[int, int] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    sources: dict[int, dict[str, int]] = field(default_factory=dict)
    languages: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, ord_: int, text: str, n_tokens: int, meta: str | None) -> None:
        """One kept document (``meta`` as the curated parts store it: JSON text).

        It runs once per document inside the range tasks: no row is built per call once the rows exist (a
        ``setdefault`` with a fresh row built one each time), and an ASCII text's bytes are its characters."""
        n_chars = len(text)
        n_bytes = n_chars if text.isascii() else len(text.encode("utf-8"))
        chars, tokens = self.chars, self.tokens
        k = n_chars.bit_length() - 1 if n_chars > 1 else 0
        chars[k] = chars.get(k, 0) + 1
        k = n_tokens.bit_length() - 1 if n_tokens > 1 else 0
        tokens[k] = tokens.get(k, 0) + 1
        src = max(bisect_right(self.input_starts, ord_ >> 40) - 1, 0)
        row = self.sources.get(src)
        if row is None:
            row = self.sources[src] = dict.fromkeys(_SOURCE_FIELDS, 0)
        _bump(row, n_bytes, n_tokens)
        lang = _lang_of(meta)
        if lang is None:
            return
        row = self.languages.get(lang)
        if row is None:
            if len(self.languages) >= MAX_LANGUAGES:
                lang = "other"
            row = self.languages.get(lang)
            if row is None:
                row = self.languages[lang] = dict.fromkeys(_LANG_FIELDS, 0)
        _bump(row, n_bytes, n_tokens)
        if ord_ % SAMPLE_EVERY == 0:
            row["sample_docs"] += 1
            row["sample_bytes"] += n_bytes
            row["sample_tokens"] += n_tokens
            row["sample_words"] += len(text.split())

    def to_json(self) -> dict[str, Any]:
        """Sorted keys (bins as strings), so the same documents give the same ``stats.json``."""
        return {"sample_every": SAMPLE_EVERY,
                "chars": {str(k): v for k, v in sorted(self.chars.items())},
                "tokens": {str(k): v for k, v in sorted(self.tokens.items())},
                "sources": {str(k): dict(v) for k, v in sorted(self.sources.items())},
                "languages": {k: dict(v) for k, v in sorted(self.languages.items())}}


def _bump(row: dict[str, int], n_bytes: int, n_tokens: int) -> None:
    row["docs"] += 1
    row["bytes"] += n_bytes
    row["tokens"] += n_tokens


def merge_profiles(profiles: list[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """Ranges' (or groups') profiles summed into one; None when none was recorded (an older work folder)."""
    given = [p for p in profiles if p]
    if not given:
        return None
    out: dict[str, Any] = {"sample_every": SAMPLE_EVERY, "chars": {}, "tokens": {}, "sources": {}, "languages": {}}
    for p in given:
        for hist in ("chars", "tokens"):
            for k, v in p.get(hist, {}).items():
                out[hist][k] = out[hist].get(k, 0) + int(v)
        for table in ("sources", "languages"):
            for k, row in p.get(table, {}).items():
                acc = out[table].setdefault(k, {})
                for f, v in row.items():
                    acc[f] = acc.get(f, 0) + int(v)
    for key in ("chars", "tokens", "sources", "languages"):
        out[key] = dict(sorted(out[key].items(), key=lambda kv: (int(kv[0]) if kv[0].isdigit() else 0, kv[0])))
    return out
