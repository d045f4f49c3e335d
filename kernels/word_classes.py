"""Gopher quality's per-token sums over a document's words: how many are words (not only symbols), their
characters, and how many tokens have a letter (:class:`pipeline.filters.gopher.GopherQuality`).

Why a kernel: a Python step per token (a dict of codes probed twice per token, on a million-entry dict) was a
large part of the filter's cost; the C loop in ``kernels/text_native.c`` reads each token's characters
directly. :func:`word_sums_py` is the same in Python (the reference the tests compare with); where the extension
is not built, the filter keeps its own cached per-token codes.

**Must equal** :func:`word_sums_py`. **Fallback**: the filter's cached per-token codes
(:meth:`pipeline.filters.gopher.GopherQuality._word_sums`); it **steps aside** where the extension is not built.
**Difference test**: ``tests/test_filters_heuristic.py`` (``test_gopher_quality_word_sums_in_c_equal_python``).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

_native: ModuleType | None  # the C extension (kernels/_text_native.pyi), None where it is not built
try:
    from kernels import _text_native as _native
except ImportError:  # not built (no compiler at install time): the Python path below
    _native = None


def symbol_bitmap(symbols: Iterable[str]) -> bytes:
    """One bit per code point, set for each of ``symbols`` (single characters): what :func:`word_sums` reads."""
    bits = bytearray(0x110000 // 8)
    for c in symbols:
        o = ord(c)
        bits[o >> 3] |= 1 << (o & 7)
    return bytes(bits)


def native() -> bool:
    """Whether the C extension is built (else callers keep their Python path)."""
    return _native is not None


def word_sums(words: list[str], bitmap: bytes) -> tuple[int, int, int]:
    """(tokens that are not made of symbols only, their characters, tokens with an alphabetic character) among
    ``words``; ``bitmap`` is :func:`symbol_bitmap` of the symbols. Needs the extension (:func:`native`)."""
    if _native is None:
        raise RuntimeError("kernels._text_native is not built")
    return _native.word_sums(words, bitmap)


def word_sums_py(words: list[str], symbols: frozenset[str]) -> tuple[int, int, int]:
    """:func:`word_sums` in Python (the same result)."""
    n_words = len_words = n_alpha = 0
    for w in words:
        if not symbols.issuperset(w):
            n_words += 1
            len_words += len(w)
        n_alpha += any(c.isalpha() for c in w)
    return n_words, len_words, n_alpha
