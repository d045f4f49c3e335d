"""The dedup kernels' faster paths give exactly what the straightforward ones give."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from kernels import minhash
from pipeline.dedup import graph as g
from pipeline.dedup.near_config import _sorted_distinct


def _texts(seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    words = ["alpha", "Beta", "ΓΆΜΜΑ", "İzmir", "ΣΟΦΟΣ", "naïve", "東京", "x1", "42", "--", "e\u0301", "🙂"]
    out = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 300))) for _ in range(60)]
    out[5] = ""
    out[9] = " ".join(rng.choice(words) for _ in range(20000))  # longer than a pass on its own
    return out


@pytest.mark.parametrize("shingle", ["word", "char"])
def test_passes_of_bounded_length_change_nothing(monkeypatch, shingle):
    texts = _texts()
    mh = minhash.MinHasher(64, 1, 5, shingle, "fast")
    whole = mh.shingle_hashes64(texts)
    sigs = mh.signatures(texts)
    monkeypatch.setattr(minhash, "PASS_CHARS", 500)
    cut = mh.shingle_hashes64(texts)
    assert np.array_equal(whole[0], cut[0]) and np.array_equal(whole[1], cut[1])
    assert np.array_equal(sigs, mh.signatures(texts))


def test_word_table_filled_lazily_is_the_per_character_rule():
    def expected(cp: int) -> int:
        if 0xD800 <= cp < 0xE000:
            return 0
        low = chr(cp).lower()
        return ord(low) if len(low) == 1 and re.fullmatch(r"\w", low) else 0

    cps = np.array(sorted({*range(0, 0x110000, 97), *range(0x370, 0x400), 0x130, 0x3A3, 0xD800, 0xDFFF, 0x10FFFF,
                           *range(0, 128)}), dtype=np.uint32)
    table = minhash._WordChars()
    got = table.lookup(cps[::-1].copy())[::-1]  # in any order, with the ASCII part already known
    assert got.tolist() == [expected(int(c)) for c in cps]
    assert table.lookup(cps).tolist() == got.tolist()  # from the filled table the second time


def test_sorted_distinct_is_unique():
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 50, 5000):
        h = rng.integers(0, 40, n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        assert np.array_equal(_sorted_distinct(h), np.unique(h))


def test_jaccard_sorted_counts_the_intersection_exactly():
    rng = np.random.default_rng(1)
    for _ in range(300):
        a = np.unique(rng.integers(0, 200, rng.integers(0, 60)).astype(np.uint64))
        b = np.unique(rng.integers(0, 200, rng.integers(0, 60)).astype(np.uint64))
        if len(a) == 0 and len(b) == 0:
            assert g.jaccard_sorted(a, b) == 1.0
            continue
        inter = len(np.intersect1d(a, b))
        assert g.jaccard_sorted(a, b) == inter / (len(a) + len(b) - inter)
        assert g.jaccard_sorted(b, a) == g.jaccard_sorted(a, b)
