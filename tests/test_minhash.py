"""The MinHash kernel: datasketch-equal signatures, shingling, LSH parameters, band keys."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
from datasketch import MinHash
from datasketch.lsh import _optimal_param

from kernels import minhash as km
from kernels.minhash import MinHasher, band_keys, fast_shingle_hash, optimal_param

TEXTS = [
    "Hello world, this is a test of the MinHash kernel with a few more words than five.",
    "short one",
    "",
    "!!! ... ???",
    "Ünïcödé STRASSE straße ΣΊΣΥΦΟΣ ΟΔΟΣ İstanbul 東京 tokyo snake_case 123 4.5 x²",
    "a b c d e f g h " * 30,
    "x",
    "tab\tand\nnewline  and   spaces\u00a0nbsp",
]


def _random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pool = [chr(c) for c in range(32, 127)] * 4 + [chr(rng.randrange(0x80, 0x2FFFF)) for _ in range(500)]
    pool += ["\u0130", "\u03a3", "\u1e9e", "\ud800", "\u0345", "\U0001f600", " ", " ", "\n"]
    return ["".join(rng.choice(pool) for _ in range(rng.randrange(0, 200))) for _ in range(n)]


@pytest.mark.parametrize("scheme", ["affine32", "legacy"])
@pytest.mark.parametrize("shingle", ["word", "char"])
@pytest.mark.parametrize("ngram", [1, 3, 5])
def test_sha1_signatures_equal_datasketch(scheme: str, shingle: str, ngram: int) -> None:
    mh = MinHasher(num_perm=64, seed=7, ngram=ngram, shingle=shingle, hashfunc="sha1", scheme=scheme)
    texts = TEXTS + _random_texts(20, ngram)
    sigs = mh.signatures(texts)
    assert sigs.dtype == (np.uint32 if scheme == "affine32" else np.uint64)
    for text, sig in zip(texts, sigs, strict=True):
        ref = MinHash(num_perm=64, seed=7, scheme=scheme)
        ref.update_batch(mh.shingles(text))
        np.testing.assert_array_equal(sig, ref.hashvalues)


@pytest.mark.parametrize("shingle", ["word", "char"])
def test_fast_hash_uses_the_same_permutations(shingle: str) -> None:
    """Given the same input hash (the scalar reference of the fast hash), datasketch agrees too:
    the vectorized tokenizer, hash and permutations match it element for element."""
    mh = MinHasher(num_perm=32, seed=3, ngram=3, shingle=shingle)
    texts = TEXTS + _random_texts(60, 11)
    sigs = mh.signatures(texts)
    for text, sig in zip(texts, sigs, strict=True):
        parts = [s.decode("utf-8", "surrogatepass") for s in mh.shingles(text)]
        parts = [p.split(" ") if shingle == "word" else list(p) for p in parts]
        ref = MinHash(num_perm=32, seed=3, hashfunc=lambda p: fast_shingle_hash(p, shingle))
        ref.update_batch(parts)
        np.testing.assert_array_equal(sig, ref.hashvalues, err_msg=repr(text))


def test_word_shingles_match_the_ground_truth_rule() -> None:
    mh = MinHasher(ngram=5)
    assert mh.shingles("One two, three!") == [b"one two three"]  # fewer than 5 tokens: one shingle
    assert mh.shingles("a b c d e f") == [b"a b c d e", b"b c d e f"]
    assert mh.shingles("...") == []
    text = "The Quick brown fox jumps over the lazy dog again and again"
    toks = re.findall(r"\w+", text.lower())
    assert mh.shingles(text) == [" ".join(toks[i : i + 5]).encode() for i in range(len(toks) - 4)]
    counts = mh.num_shingles(["...", "one", "a b c d e f"])
    np.testing.assert_array_equal(counts, [0, 1, 2])


def test_empty_document_gets_the_empty_minhash() -> None:
    sig = MinHasher(num_perm=16).signatures(["", "?!"])
    np.testing.assert_array_equal(sig, np.full((2, 16), (1 << 32) - 1, dtype=np.uint32))
    np.testing.assert_array_equal(MinHash(num_perm=16).hashvalues, sig[0])


def test_batch_boundaries_do_not_change_signatures() -> None:
    texts = _random_texts(50, 5) + TEXTS
    mh = MinHasher(num_perm=32)
    whole = mh.signatures(texts)
    one_by_one = np.concatenate([mh.signatures([t]) for t in texts])
    np.testing.assert_array_equal(whole, one_by_one)


def test_long_document_spanning_permutation_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(km, "CHUNK_SHINGLES", 7)
    rng = random.Random(1)
    texts = [" ".join(f"w{rng.randrange(1000)}" for _ in range(n)) for n in (40, 3, 25, 1, 60)]
    mh = MinHasher(num_perm=16, hashfunc="sha1")
    for text, sig in zip(texts, mh.signatures(texts), strict=True):
        ref = MinHash(num_perm=16)
        ref.update_batch(mh.shingles(text))
        np.testing.assert_array_equal(sig, ref.hashvalues)


def test_torch_path_equals_numpy() -> None:
    torch = pytest.importorskip("torch")
    del torch
    mh = MinHasher(num_perm=64)
    h, off = mh.shingle_hashes32(TEXTS + _random_texts(30, 2))
    expect = mh.signatures_from_hashes(h, off)
    out = np.full_like(expect, (1 << 32) - 1)
    got = km._permute_min_torch(km.fmix32(h), off, mh.a, mh.b, "cpu", out)
    np.testing.assert_array_equal(got, expect)


def test_signature_agreement_estimates_jaccard() -> None:
    rng = random.Random(4)
    words = [f"w{i}" for i in range(3000)]
    base = [rng.choice(words) for _ in range(400)]
    edited = [w if rng.random() > 0.03 else rng.choice(words) for w in base]
    mh = MinHasher(num_perm=256)
    a, b = (set(mh.shingles(" ".join(x))) for x in (base, edited))
    true_j = len(a & b) / len(a | b)
    sig = mh.signatures([" ".join(base), " ".join(edited)])
    est = float((sig[0] == sig[1]).mean())
    assert 0.5 < true_j < 0.95
    assert abs(est - true_j) < 0.1


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9])
@pytest.mark.parametrize("num_perm", [64, 128, 256])
def test_optimal_param_matches_datasketch(threshold: float, num_perm: int) -> None:
    assert optimal_param(threshold, num_perm) == _optimal_param(threshold, num_perm, 0.5, 0.5)
    assert optimal_param(threshold, num_perm, 0.15, 0.85) == _optimal_param(threshold, num_perm, 0.15, 0.85)


def test_band_keys() -> None:
    rng = np.random.default_rng(0)
    sigs = rng.integers(0, 1 << 32, size=(3, 12), dtype=np.uint64).astype(np.uint32)
    sigs[1, :4] = sigs[0, :4]  # docs 0 and 1 agree on band 0 only
    keys = band_keys(sigs, 3, 4)
    assert keys.shape == (3, 3)
    assert keys[0, 0] == keys[1, 0]
    assert keys[0, 1] != keys[1, 1] and keys[0, 2] != keys[1, 2]
    same = np.tile(sigs[2, :4], 3)[None, :].astype(np.uint32)  # equal values in every band
    k = band_keys(same, 3, 4)[0]
    assert len(set(k.tolist())) == 3  # the band index keeps bands apart
    with pytest.raises(ValueError, match="exceeds num_perm"):
        band_keys(sigs, 4, 4)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="shingle"):
        MinHasher(shingle="byte")
    with pytest.raises(ValueError, match="hashfunc"):
        MinHasher(hashfunc="md5")
    with pytest.raises(ValueError, match="scheme"):
        MinHasher(scheme="affine64")
    with pytest.raises(ValueError, match="ngram"):
        MinHasher(ngram=0)
    with pytest.raises(ValueError, match="threshold"):
        optimal_param(1.0, 128)
