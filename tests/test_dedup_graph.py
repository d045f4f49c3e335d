"""Numpy pieces of dedup: LSH buckets to pairs, partitioning, and connected components."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components as scipy_cc

from pipeline.dedup import graph as g


def _expected_roots(pairs: np.ndarray) -> dict[int, int]:
    nodes = np.unique(pairs)
    pos = np.searchsorted(nodes, pairs)
    graph = coo_matrix((np.ones(len(pairs)), (pos[:, 0], pos[:, 1])), shape=(len(nodes), len(nodes)))
    _, comp = scipy_cc(graph, directed=False)
    root: dict[int, int] = {}
    for node, c in zip(nodes, comp, strict=True):
        root.setdefault(int(c), int(node))  # nodes are sorted: the first seen is the smallest
    return {int(n): root[int(c)] for n, c in zip(nodes, comp, strict=True) if root[int(c)] != n}


@pytest.mark.parametrize("seed", range(6))
def test_components_match_scipy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 400))
    if seed % 2:  # long chains are the slow case for label propagation
        perm = rng.permutation(n)
        pairs = np.stack([perm[:-1], perm[1:]], axis=1)
    else:
        pairs = rng.integers(0, n, size=(int(rng.integers(1, 2 * n)), 2))
    pairs = pairs[pairs[:, 0] != pairs[:, 1]].astype(np.int64) * 3 - 100  # negative nodes too
    got = {int(a): int(b) for a, b in g.connected_components(pairs)}
    assert got == _expected_roots(pairs)


def test_components_of_nothing() -> None:
    assert len(g.connected_components(g.EMPTY_PAIRS)) == 0


def test_bucket_pairs_all_pairs_then_star() -> None:
    keys = np.array([5, 5, 5, 7, 7, 9, 5, 5], dtype=np.uint64)
    nodes = np.array([3, 1, 2, 8, 4, 6, 1, 1], dtype=np.int64)
    assert g.bucket_pairs(keys, nodes).tolist() == [[1, 2], [1, 3], [2, 3], [4, 8]]
    # a bucket over max_bucket becomes a star around its smallest node
    assert g.bucket_pairs(keys, nodes, max_bucket=2).tolist() == [[1, 2], [1, 3], [4, 8]]
    assert len(g.bucket_pairs(np.zeros(0, np.uint64), np.zeros(0, np.int64))) == 0


def test_partition_is_stable_and_spread() -> None:
    values = np.arange(10000, dtype=np.int64)
    parts = g.partition_of(values, 8)
    np.testing.assert_array_equal(parts, g.partition_of(values.copy(), 8))
    counts = np.bincount(parts, minlength=8)
    assert counts.min() > 1000
    pieces = g.split_by(parts, 8, values)
    assert sum(len(p[0]) for p in pieces) == len(values)
    assert all(np.all(g.partition_of(p[0], 8) == k) for k, p in enumerate(pieces))


def test_jaccard_sorted() -> None:
    a = np.array([1, 2, 3, 4], dtype=np.uint64)
    b = np.array([3, 4, 5], dtype=np.uint64)
    assert g.jaccard_sorted(a, b) == pytest.approx(2 / 5)
    assert g.jaccard_sorted(a, a) == 1.0
