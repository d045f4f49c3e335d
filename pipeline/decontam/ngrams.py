"""Normalized words and vectorized n-gram hashes, shared by the benchmark index and the document side.

Words are ``\\w+`` runs of the NFKC, case-folded text: whitespace, punctuation and case carry no identity
here, so reflowed lines, changed case and re-indented code give the same words. This is the
normalization of GPT-3's contamination study (Brown et al. 2020, appendix C: "ignoring all punctuation,
whitespace, and casing"), with one addition: a single ASCII letter followed by ``.``, ``)`` or ``:`` is
not a word. Option labels (``A.``, ``(b)``, ``Q:``) are how a copied multiple-choice item differs from
the benchmark record, and without them the choices of an MMLU item are one span again. The letter is
dropped on both sides, so no copy is missed for it; the article "a" and a variable ``x`` stay words.

A gram's hash is a polynomial hash mod 2**64 of its words' values, taken from prefix hashes, so the
hashes of every window of any length L over a text come from one O(words) vector operation. Word values
are splitmix64 of the word's id in the index's vocabulary; a word outside the vocabulary cannot belong
to a benchmark gram, so every window holding one is skipped without being hashed.
"""

from __future__ import annotations

import re
import unicodedata

import numpy as np

#: runs of word characters, less a lone ASCII letter that is a label ("A.", "(b)", "Q:"); written so that
#: each alternative starts on a distinct first character (as fast as a plain ``\w+``)
_WORD = re.compile(r"[^\W_a-zA-Z]\w*|[a-zA-Z](?:\w+|(?![.):]))|_\w*")
_U64 = np.uint64
#: odd multiplier of the polynomial hash (the 64-bit golden ratio constant): invertible mod 2**64
_P = 0x9E3779B97F4A7C15
_P_INV = pow(_P, -1, 1 << 64)
_LENGTH_SALT = 0xD6E8FEB86659FD93
_MASK = (1 << 64) - 1


def words(text: str) -> list[str]:
    """The normalized words of ``text``: ``\\w+`` runs of its NFKC, case-folded form, less option labels."""
    if text.isascii():  # NFKC leaves ASCII as it is, and case folding is lower()
        return _WORD.findall(text.lower())
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, element-wise on uint64 (wrapping arithmetic)."""
    x = np.atleast_1d(np.asarray(x, dtype=_U64))
    x = x ^ (x >> _U64(30))
    x = x * _U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> _U64(27))
    x = x * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def _powers(base: int, n: int) -> np.ndarray:
    """``base**0 .. base**(n-1)`` mod 2**64."""
    out = np.full(n, base, dtype=_U64)
    out[:1] = 1
    return np.cumprod(out, dtype=_U64)


class Prefix:
    """Prefix hashes of a sequence of word values: the hash of any window in O(1), vectorized.

    ``H[i] = sum(v[j] * P**(i-1-j) for j < i)``, built as ``P**(i-1) * cumsum(v[j] * P**-j)`` (P is odd,
    hence invertible mod 2**64), so that ``window(i, L) = H[i+L] - H[i] * P**L``.
    """

    def __init__(self, values: np.ndarray):
        n = len(values)
        self.n = n
        self.pow = _powers(_P, n + 1)
        s = np.cumsum(np.asarray(values, dtype=_U64) * _powers(_P_INV, n), dtype=_U64)
        self.h = np.zeros(n + 1, dtype=_U64)
        self.h[1:] = self.pow[:n] * s

    def windows(self, starts: np.ndarray, length: int | np.ndarray) -> np.ndarray:
        """Key of the ``length`` words from each of ``starts`` (``length``: one, or one per start)."""
        starts = np.asarray(starts, dtype=np.int64)
        length = np.asarray(length, dtype=np.int64)
        raw = self.h[starts + length] - self.h[starts] * self.pow[length]
        # the length is salted in (times an odd constant: distinct per length) so that grams of every
        # length share one table without a 7-gram key standing for a 13-gram
        return raw ^ (length.astype(_U64) * _U64(_LENGTH_SALT))

    def all_windows(self, length: int) -> np.ndarray:
        """Keys of the windows of ``length`` words from every start 0..n-length (slices: no gathers)."""
        raw = self.h[length:] - self.h[: self.n + 1 - length] * self.pow[length]
        return raw ^ _U64((length * _LENGTH_SALT) & _MASK)


def word_values(ids: np.ndarray) -> np.ndarray:
    """The hash value of each vocabulary id (any value for -1, an unknown word: its windows are skipped)."""
    return mix64(np.asarray(ids, dtype=np.int64).astype(_U64) + _U64(1))
