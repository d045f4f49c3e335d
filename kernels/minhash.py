"""Vectorized MinHash signatures, bit-compatible with datasketch's permutation schemes.

Why a kernel: datasketch hashes every shingle with SHA-1 in Python and permutes per document. Here a whole
batch of documents is tokenized, hashed and permuted with a handful of numpy calls:

- tokens: lower-cased ``\\w+`` runs (Python ``re`` semantics) found on a code-point array;
- the default ``fast`` hash: a polynomial hash of each token's code points (prefix sums, mod 2^64),
  n consecutive token hashes combined with fixed odd multipliers, mixed by the MurmurHash3
  finalizer; the top 32 bits feed the permutations. ``sha1`` hashes the UTF-8 shingle bytes exactly
  as datasketch's default ``sha1_hash32`` does, for equality with datasketch;
- permutations: datasketch's ``affine32`` (default since datasketch 2.0: fmix32 pre-mix, then
  ``a * h + b mod 2^32``) or ``legacy`` (``(a * h + b) % (2^61 - 1) & (2^32 - 1)``), with ``a`` and
  ``b`` drawn from ``np.random.RandomState(seed)`` in datasketch's order. For the same hash values
  and seed the signatures are equal to ``datasketch.MinHash(...).hashvalues``.

An optional torch path (``device="cuda"``/``"auto"``) applies the permutations on a GPU.

**Must equal** ``datasketch.MinHash(...).hashvalues`` (``datasketch>=1.6``) for ``hashfunc="sha1"``, and datasketch's
LSH parameters (``optimal_param``). **Fallback**: none at run time (this kernel is the implementation; the torch
path falls back to NumPy where no GPU is). **Difference test**: ``tests/test_minhash.py``; bench:
``bench/minhash.py``.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

U64 = np.uint64
U32 = np.uint32
MERSENNE = U64((1 << 61) - 1)
MAX32 = U64((1 << 32) - 1)
SCHEMES = ("affine32", "legacy")
HASHES = ("fast", "sha1")
SHINGLES = ("word", "char")
#: shingles permuted per numpy pass: keeps the (num_perm x chunk) matrix in cache
CHUNK_SHINGLES = 8192
#: characters hashed per vectorized pass: a batch of long documents is cut into runs of documents this
#: long, so the working arrays (and the cached powers, which grow to the longest pass) stay small
PASS_CHARS = 1 << 20

_WORD = re.compile(r"\w+")
_SPACE = re.compile(r"\s+")
_POLY = U64(0x100000001B3)  # the FNV-64 prime: odd, so invertible mod 2^64
_POLY_INV = U64(pow(0x100000001B3, -1, 1 << 64))


def _splitmix64(n: int, seed: int) -> np.ndarray:
    """n fixed odd 64-bit constants (splitmix64 stream): the per-position shingle multipliers."""
    out, x = [], seed
    for _ in range(n):
        x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        out.append((z ^ (z >> 31)) | 1)
    return np.array(out, dtype=U64)


MAX_NGRAM = 64
_MULT = _splitmix64(MAX_NGRAM, 0x746F6B656E6D696C)  # "tokenmil"
_BAND_MULT = _splitmix64(1024 + 1, 0x62616E64)  # "band"


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer (a bijection that spreads every input bit)."""
    h = h ^ (h >> U64(33))
    h = h * U64(0xFF51AFD7ED558CCD)
    h = h ^ (h >> U64(33))
    h = h * U64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> U64(33))


def fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer, as datasketch's ``affine32`` scheme applies it."""
    h = h ^ (h >> U32(16))
    h = h * U32(0x85EBCA6B)
    h = h ^ (h >> U32(13))
    h = h * U32(0xC2B2AE35)
    return h ^ (h >> U32(16))


#: characters whose str.lower() is not a per-character map (U+0130 lowers to two characters, capital
#: sigma depends on its context): a document holding one is lowered by str.lower itself.
_LOWER_SPECIAL = ("\u0130", "\u03a3")


def _word_chars_of(cps: np.ndarray) -> np.ndarray:
    """Per code point of ``cps``: its lower-case code point when that is a ``\\w`` character (Python
    ``re``), else 0 (surrogates and characters that lower to several are not word characters)."""
    chars = "".join(" " if 0xD800 <= i < 0xE000 else chr(i) for i in cps.tolist())
    lowered = "".join(c if len(c) == 1 else " " for c in (ch.lower() for ch in chars))
    marks = re.sub(r"\w", "\x01", re.sub(r"\W", "\x00", lowered))
    word = np.frombuffer(marks.encode("latin-1"), dtype=np.uint8).astype(bool)
    table = np.frombuffer(lowered.encode("utf-32-le"), dtype=np.uint32).copy()
    table[~word] = 0
    return table


class _WordChars:
    """:func:`_word_chars_of` for every code point, filled in as code points are first seen: the whole
    table is a scan of every code point in Python, and a corpus uses a few thousand of them."""

    UNKNOWN = np.uint32(0xFFFFFFFF)  # above every code point

    def __init__(self) -> None:
        self._table: np.ndarray | None = None
        self.ascii = _word_chars_of(np.arange(128, dtype=np.uint32)).astype(np.uint8)

    def lookup(self, cps: np.ndarray) -> np.ndarray:
        """The table gathered at ``cps`` (uint32 code points)."""
        if self._table is None:
            self._table = np.full(0x110000, self.UNKNOWN, dtype=np.uint32)
            self._table[:128] = self.ascii
        out = self._table[cps]
        missing = out == self.UNKNOWN
        if missing.any():
            new = np.unique(cps[missing])
            self._table[new] = _word_chars_of(new)
            out = self._table[cps]
        return out


_WORD_CHARS = _WordChars()


def _word_chars() -> np.ndarray:
    """The whole table (tests); the kernel gathers through :data:`_WORD_CHARS` instead."""
    return _WORD_CHARS.lookup(np.arange(0x110000, dtype=np.uint32))


class _Powers:
    """Cached powers of the polynomial base and of its inverse, grown on demand."""

    def __init__(self) -> None:
        self.pw = np.ones(1, dtype=U64)
        self.ipw = np.ones(1, dtype=U64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.pw) < n:
            size = max(n, 2 * len(self.pw), 1 << 16)
            with np.errstate(over="ignore"):
                pw = np.cumprod(np.full(size, _POLY, dtype=U64))
                ipw = np.cumprod(np.full(size, _POLY_INV, dtype=U64))
            self.pw = np.concatenate([np.ones(1, U64), pw[:-1]])
            self.ipw = np.concatenate([np.ones(1, U64), ipw[:-1]])
        return self.pw[:n], self.ipw[:n]


_POWERS = _Powers()


def permutations(num_perm: int, seed: int = 1, scheme: str = "affine32") -> tuple[np.ndarray, np.ndarray]:
    """The ``(a, b)`` parameters datasketch draws for ``MinHash(num_perm, seed, scheme=...)``."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if num_perm < 1:
        raise ValueError("num_perm must be positive")
    gen = np.random.RandomState(seed)
    if scheme == "legacy":
        ab = np.array(
            [(gen.randint(1, MERSENNE, dtype=U64), gen.randint(0, MERSENNE, dtype=U64))
             for _ in range(num_perm)],
            dtype=U64,
        ).T
        return ab[0].copy(), ab[1].copy()
    a = gen.randint(0, 1 << 31, num_perm, dtype=U32) * U32(2) + U32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=U32)
    return a, b


def sha1_hash32(data: bytes) -> int:
    """datasketch's default hash: the first 4 bytes of SHA-1, little-endian."""
    return struct.unpack("<I", hashlib.sha1(data).digest()[:4])[0]


def _fast_token_hash(token: str) -> int:
    """Scalar reference of the vectorized token hash (used by tests and :func:`fast_shingle_hash`)."""
    h, p, mask = 0, 1, (1 << 64) - 1
    for ch in token:
        h = (h + ord(ch) * p) & mask
        p = (p * int(_POLY)) & mask
    return int(fmix64(np.array([h], dtype=U64))[0])


def fast_shingle_hash(parts: Sequence[str], shingle: str = "word") -> int:
    """Scalar reference of the ``fast`` 32-bit shingle hash: ``parts`` are the shingle's tokens
    (word shingles) or characters (char shingles). Slow; for tests and for datasketch's ``hashfunc``."""
    mask = (1 << 64) - 1
    if shingle == "word":
        vals = [_fast_token_hash(t) for t in parts]
    else:
        vals = [ord(c) for c in parts]
    acc = 0
    for k, v in enumerate(vals):
        acc = (acc + v * int(_MULT[k])) & mask
    return int(fmix64(np.array([acc], dtype=U64))[0] >> U64(32))


def optimal_param(
    threshold: float, num_perm: int, false_positive_weight: float = 0.5, false_negative_weight: float = 0.5
) -> tuple[int, int]:
    """Bands x rows minimizing weighted false positive + false negative area (datasketch's rule)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    return _optimal_param(round(threshold, 12), num_perm, false_positive_weight, false_negative_weight)


@lru_cache(maxsize=64)
def _optimal_param(t: float, num_perm: int, wfp: float, wfn: float) -> tuple[int, int]:
    # Gauss-Legendre quadrature on [0, t] and [t, 1]: the integrands are smooth polynomials in s.
    x, w = np.polynomial.legendre.leggauss(64)
    s_lo, w_lo = t / 2 * (x + 1), w * t / 2
    s_hi, w_hi = t + (1 - t) / 2 * (x + 1), w * (1 - t) / 2
    best, opt = float("inf"), (0, 0)
    for b in range(1, num_perm + 1):
        r = np.arange(1, num_perm // b + 1, dtype=float)[:, None]
        fp = ((1 - (1 - s_lo**r) ** b) * w_lo).sum(axis=1)
        fn = (((1 - s_hi**r) ** b) * w_hi).sum(axis=1)
        err = fp * wfp + fn * wfn
        i = int(np.argmin(err))
        if err[i] < best - 1e-15:
            best, opt = float(err[i]), (b, i + 1)
    return opt


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """One 64-bit key per (document, band): a hash of the band's ``rows`` values and its index.

    Two documents share a key in band i exactly when their band-i values are equal (up to a 2^-64
    collision); the band index is mixed in so keys of different bands never meet.
    """
    if bands * rows > sigs.shape[1]:
        raise ValueError(f"bands x rows = {bands * rows} exceeds num_perm = {sigs.shape[1]}")
    if bands > len(_BAND_MULT) - 1:
        raise ValueError(f"at most {len(_BAND_MULT) - 1} bands")
    s = sigs[:, : bands * rows].astype(U64).reshape(len(sigs), bands, rows)
    with np.errstate(over="ignore"):
        acc = (s * _MULT[:rows]).sum(axis=2, dtype=U64)
        acc = acc + _BAND_MULT[1 : bands + 1] * _BAND_MULT[0]
        return fmix64(acc)


class MinHasher:
    """Shingles documents and computes their MinHash signatures, many documents per call.

    ``signatures(texts)`` returns an ``(n, num_perm)`` array (uint32 for ``affine32``, uint64 for
    ``legacy``, as datasketch stores them); a document with no shingle (no word character) gets the
    all-max row datasketch gives an empty MinHash: check :meth:`num_shingles` before matching on it.
    """

    def __init__(
        self,
        num_perm: int = 128,
        seed: int = 1,
        ngram: int = 5,
        shingle: str = "word",
        hashfunc: str = "fast",
        scheme: str = "affine32",
        device: str = "cpu",
    ) -> None:
        if shingle not in SHINGLES:
            raise ValueError(f"shingle must be one of {SHINGLES}, got {shingle!r}")
        if hashfunc not in HASHES:
            raise ValueError(f"hashfunc must be one of {HASHES}, got {hashfunc!r}")
        if not 1 <= ngram <= MAX_NGRAM:
            raise ValueError(f"ngram must be in 1..{MAX_NGRAM}, got {ngram}")
        if device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', got {device!r}")
        self.num_perm, self.seed, self.ngram = num_perm, seed, ngram
        self.shingle, self.hashfunc, self.scheme = shingle, hashfunc, scheme
        self.a, self.b = permutations(num_perm, seed, scheme)
        self.dtype = U32 if scheme == "affine32" else U64
        self.device = _resolve_device(device) if scheme == "affine32" else "cpu"

    # ---- shingles -------------------------------------------------------------------------
    def _prepare(self, text: str) -> str:
        text = text.lower()
        return _SPACE.sub(" ", text).strip() if self.shingle == "char" else text

    def shingles(self, text: str) -> list[bytes]:
        """The document's shingles as UTF-8 bytes (what to feed datasketch's ``update_batch``).

        Word shingles: n consecutive lower-cased ``\\w+`` tokens joined by one space; a document with
        fewer than n tokens is one shingle. Char shingles: n-character windows of the lower-cased,
        whitespace-collapsed text (a shorter text is one shingle). Duplicates are kept (MinHash is a
        min: repeats change nothing).
        """
        n = self.ngram
        if self.shingle == "word":
            toks = _WORD.findall(text.lower())
            if not toks:
                return []
            if len(toks) < n:
                return [" ".join(toks).encode("utf-8", "surrogatepass")]
            return [" ".join(toks[i : i + n]).encode("utf-8", "surrogatepass") for i in range(len(toks) - n + 1)]
        t = self._prepare(text)
        if not t:
            return []
        if len(t) < n:
            return [t.encode("utf-8", "surrogatepass")]
        return [t[i : i + n].encode("utf-8", "surrogatepass") for i in range(len(t) - n + 1)]

    def shingle_hashes64(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """64-bit hashes of every document's shingles, vectorized over the batch.

        Returns ``(hashes, offsets)``: document i's shingles are ``hashes[offsets[i]:offsets[i+1]]``.
        A document's hashes do not depend on the others, so a long batch is hashed in runs of
        :data:`PASS_CHARS` characters (the powers of a pass over megabytes would cost more than the hashing).
        """
        texts = list(texts)
        cuts = [0]
        size = 0
        for i, t in enumerate(texts):
            if size and size + len(t) > PASS_CHARS:
                cuts.append(i)
                size = 0
            size += len(t) + 1
        if len(cuts) == 1:
            return self._shingle_hashes64(texts)
        runs = [self._shingle_hashes64(texts[a:b]) for a, b in zip(cuts, [*cuts[1:], len(texts)], strict=True)]
        offsets = [np.zeros(1, np.int64)]
        base = 0
        for _, off in runs:
            offsets.append(off[1:] + base)
            base += int(off[-1])
        return np.concatenate([h for h, _ in runs]), np.concatenate(offsets)

    def _shingle_hashes64(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        n = self.ngram
        if self.shingle == "char":
            docs = [self._prepare(t) for t in texts]
        else:  # lower-cased below through a table, unless str.lower is context-dependent for it
            docs = list(texts)
        if not docs:
            return np.zeros(0, U64), np.zeros(1, np.int64)
        joined = "\n".join(docs)
        if self.shingle == "word" and any(c in joined for c in _LOWER_SPECIAL):
            docs = [t.lower() if any(c in t for c in _LOWER_SPECIAL) else t for t in docs]
            joined = "\n".join(docs)
        lens = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
        ascii_only = joined.isascii()
        if ascii_only:
            cps = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
        else:
            cps = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        doc_start = np.zeros(len(docs), dtype=np.int64)
        np.cumsum(lens[:-1] + 1, out=doc_start[1:])
        with np.errstate(over="ignore"):
            if self.shingle == "word":
                low = _WORD_CHARS.ascii[cps] if ascii_only else _WORD_CHARS.lookup(cps)
                return self._word_hashes(low, doc_start, n)
            return self._char_hashes(cps, doc_start, lens, n)

    @staticmethod
    def _prefix(cps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pw, ipw = _POWERS.get(len(cps))
        pref = np.zeros(len(cps) + 1, dtype=U64)
        np.cumsum(cps.astype(U64) * pw, out=pref[1:])
        return pref, ipw

    def _word_hashes(self, low: np.ndarray, doc_start: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``low``: lower-cased word characters, 0 elsewhere (documents joined by a 0)."""
        isw = (low != 0).view(np.int8)
        edge = np.diff(isw, prepend=np.int8(0), append=np.int8(0))
        bounds = np.flatnonzero(edge)  # token starts and ends alternate
        st, en = bounds[0::2], bounds[1::2]
        pref, ipw = self._prefix(low)
        tok = fmix64((pref[en] - pref[st]) * ipw[st])
        ndocs = len(doc_start)
        first = np.searchsorted(st, doc_start)  # each document's first token
        ntok = np.diff(first, append=len(st))
        tdoc = np.repeat(np.arange(ndocs), ntok)
        m = len(tok)
        full = np.zeros(0, U64)
        starts = np.zeros(0, np.int64)
        if m >= n:
            acc = tok[: m - n + 1] * _MULT[0]
            for k in range(1, n):
                acc = acc + tok[k : m - n + 1 + k] * _MULT[k]
            ok = tdoc[: m - n + 1] == tdoc[n - 1 :]
            full, starts = acc[ok], np.flatnonzero(ok)
        # documents with 1..n-1 tokens: one shingle of all their tokens
        short = np.flatnonzero((ntok > 0) & (ntok < n))
        if len(short):
            counts = ntok[short]
            seg = np.zeros(len(short), dtype=np.int64)
            np.cumsum(counts[:-1], out=seg[1:])
            pos = np.arange(int(counts.sum())) - np.repeat(seg, counts)
            part = np.add.reduceat(tok[np.repeat(first[short], counts) + pos] * _MULT[pos], seg)
            full = np.concatenate([full, part])
            starts = np.concatenate([starts, first[short]])
        if len(short):
            order = np.argsort(starts, kind="stable")
            full, starts = full[order], starts[order]
        hashes = fmix64(full)
        counts = np.where(ntok >= n, ntok - n + 1, ntok > 0)
        offsets = np.zeros(ndocs + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return hashes, offsets

    def _char_hashes(
        self, cps: np.ndarray, doc_start: np.ndarray, lens: np.ndarray, n: int
    ) -> tuple[np.ndarray, np.ndarray]:
        width = np.minimum(lens, n)  # a text shorter than n is one shingle of all of it
        counts = np.where(lens == 0, 0, np.maximum(lens - n + 1, 1))
        offsets = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        starts = np.repeat(doc_start - offsets[:-1], counts) + np.arange(offsets[-1])
        w = np.repeat(width, counts)
        hashes = np.zeros(len(starts), dtype=U64)
        for k in range(n):
            use = np.flatnonzero(w > k)
            hashes[use] += cps[starts[use] + k].astype(U64) * _MULT[k]
        return fmix64(hashes), offsets

    def shingle_hashes32(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The 32-bit input hashes the permutations see, as ``(hashes, offsets)``."""
        if self.hashfunc == "fast":
            h64, offsets = self.shingle_hashes64(texts)
            return (h64 >> U64(32)).astype(U32), offsets
        parts = [self.shingles(t) for t in texts]
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        flat = [sha1_hash32(s) for p in parts for s in p]
        return np.array(flat, dtype=U32), offsets

    def num_shingles(self, texts: Sequence[str]) -> np.ndarray:
        return np.diff(self.shingle_hashes64(texts)[1])

    # ---- signatures -----------------------------------------------------------------------
    def signatures(self, texts: Sequence[str]) -> np.ndarray:
        h, offsets = self.shingle_hashes32(texts)
        return self.signatures_from_hashes(h, offsets)

    def signatures_from_hashes(self, h: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Signatures from 32-bit shingle hashes grouped by document (``offsets`` as above)."""
        ndocs = len(offsets) - 1
        out = np.full((ndocs, self.num_perm), (1 << 32) - 1, dtype=self.dtype)
        if len(h) == 0:
            return out
        if self.scheme == "affine32":
            h = fmix32(h.astype(U32))
            if self.device != "cpu":
                return _permute_min_torch(h, offsets, self.a, self.b, self.device, out)
        else:
            h = h.astype(U64)
        counts = np.diff(offsets)
        sdoc = np.repeat(np.arange(ndocs), counts)
        buf = np.empty((self.num_perm, min(len(h), CHUNK_SHINGLES)), dtype=self.dtype)
        for c0 in range(0, len(h), CHUNK_SHINGLES):
            c1 = min(c0 + CHUNK_SHINGLES, len(h))
            docs = sdoc[c0:c1]
            seg = np.flatnonzero(np.diff(docs, prepend=-1))  # first shingle of each doc in the chunk
            mins = _permute_min(h[c0:c1], seg, self.a, self.b, self.scheme, buf[:, : c1 - c0])
            d = docs[seg]
            out[d] = np.minimum(out[d], mins)
        return out


def _permute_min(
    h: np.ndarray, seg: np.ndarray, a: np.ndarray, b: np.ndarray, scheme: str, buf: np.ndarray
) -> np.ndarray:
    """Min over each segment of shingles of every permutation: ``(len(seg), num_perm)``.

    The matrix is laid out (num_perm, shingles) so the segment minimum runs along contiguous memory,
    in a reused buffer that stays in cache.
    """
    with np.errstate(over="ignore"):
        np.multiply(a[:, None], h[None, :], out=buf)
        np.add(buf, b[:, None], out=buf)
        if scheme == "legacy":
            np.remainder(buf, MERSENNE, out=buf)
            np.bitwise_and(buf, MAX32, out=buf)
    return np.minimum.reduceat(buf, seg, axis=1).T


def _resolve_device(device: str) -> str:
    if device == "cpu":
        return "cpu"
    try:
        import torch  # optional: the numpy path needs no torch, and importing it costs seconds
    except ImportError:
        has_cuda = False
    else:
        has_cuda = bool(torch.cuda.is_available())
    if device == "cuda" and not has_cuda:
        raise RuntimeError("device='cuda' needs torch with a CUDA device; use device='cpu' or 'auto'")
    return "cuda" if has_cuda else "cpu"


def _permute_min_torch(
    h: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray, device: str, out: np.ndarray
) -> np.ndarray:
    """The affine32 permutation + per-document min in torch (int64 arithmetic, low 32 bits kept)."""
    import torch  # optional: see _resolve_device

    dev = torch.device(device)
    at = torch.as_tensor(a.astype(np.int64), device=dev)
    bt = torch.as_tensor(b.astype(np.int64), device=dev)
    counts = np.diff(offsets)
    sdoc = torch.as_tensor(np.repeat(np.arange(len(counts)), counts), device=dev)
    res = torch.as_tensor(out.astype(np.int64), device=dev)
    mask = (1 << 32) - 1
    step = max(1, (1 << 24) // len(a))
    ht = torch.as_tensor(h.astype(np.int64), device=dev)
    for c0 in range(0, len(h), step):
        v = (ht[c0 : c0 + step, None] * at[None, :] + bt[None, :]) & mask
        idx = sdoc[c0 : c0 + step, None].expand(-1, len(a))
        res.scatter_reduce_(0, idx, v, reduce="amin", include_self=True)
    return res.cpu().numpy().astype(U32)
