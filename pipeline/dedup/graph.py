"""Numpy building blocks of distributed dedup: partitioning, LSH buckets, Jaccard, connected components.

Everything here works on one partition's arrays and knows nothing of Ray, so the same code runs in
Ray tasks, in benchmarks and in tests. Nodes are int64 document ``ord`` values (negative for
documents of an earlier, published corpus, so that they sort first and are always the ones kept).

Connected components use the alternating large-star / small-star algorithm (Kiveris et al., "Connected
Components in MapReduce and Beyond", 2014): each step is one group-by on the first endpoint of a pair,
which is one hash partitioning across Ray tasks; a fixed point is a forest of stars, each centred on
its component's smallest node, reached in O(log n) steps in practice. No step needs more than one
partition of the edges in memory.
"""

from __future__ import annotations

import numpy as np

from kernels.minhash import fmix64

U64 = np.uint64
I64 = np.int64
EMPTY_PAIRS = np.zeros((0, 2), dtype=I64)


def partition_of(values: np.ndarray, parts: int) -> np.ndarray:
    """A well-spread partition index in ``[0, parts)`` for int64 or uint64 values."""
    v = np.ascontiguousarray(values).view(U64) if values.dtype == I64 else values.astype(U64)
    with np.errstate(over="ignore"):
        return (fmix64(v) % U64(parts)).astype(np.int64)


def split_by(index: np.ndarray, parts: int, *arrays: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """Split aligned arrays into ``parts`` pieces by a precomputed partition ``index``."""
    order = np.argsort(index, kind="stable")
    cuts = np.searchsorted(index[order], np.arange(1, parts))
    sorted_arrays = [a[order] for a in arrays]
    return [tuple(part) for part in zip(*(np.split(a, cuts) for a in sorted_arrays), strict=True)] if arrays \
        else [() for _ in range(parts)]


def unique_pairs(pairs: np.ndarray) -> np.ndarray:
    """Distinct rows of an (n, 2) int64 array, sorted by first then second column."""
    if len(pairs) == 0:
        return EMPTY_PAIRS
    return np.unique(pairs, axis=0)


def bucket_pairs(keys: np.ndarray, nodes: np.ndarray, max_bucket: int = 64) -> np.ndarray:
    """Candidate pairs (x, y), x < y, from LSH band rows: documents sharing a band key.

    A bucket of k <= ``max_bucket`` documents yields all its k(k-1)/2 pairs, so that a verifier sees
    every pair; a larger one yields a star (each member with the bucket's smallest node), which
    connects the same documents with k-1 pairs.
    """
    if len(keys) == 0:
        return EMPTY_PAIRS
    order = np.lexsort((nodes, keys))
    k, n = keys[order], nodes[order]
    # drop repeated (key, node) rows: one document can meet itself only once per key
    keep = np.ones(len(k), dtype=bool)
    keep[1:] = (k[1:] != k[:-1]) | (n[1:] != n[:-1])
    k, n = k[keep], n[keep]
    start = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    size = np.diff(np.r_[start, len(k)])
    out = []
    star = size > max_bucket
    if star.any():
        # every member but the first of a big bucket, paired with the first (the smallest node)
        member = np.repeat(star, size)
        first = np.repeat(start, size)
        sel = member & (np.arange(len(k)) != first)
        out.append(np.stack([n[first[sel]], n[sel]], axis=1))
    for s in np.unique(size[(size > 1) & ~star]):
        st = start[size == s]
        i, j = np.triu_indices(int(s), 1)
        out.append(np.stack([n[(st[:, None] + i).ravel()], n[(st[:, None] + j).ravel()]], axis=1))
    if not out:
        return EMPTY_PAIRS
    return unique_pairs(np.concatenate(out))


def jaccard_sorted(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two sorted arrays of distinct values."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    if len(a) > len(b):
        a, b = b, a
    # the shorter array looked up in the longer: no sort of their concatenation (np.intersect1d)
    inter = int(np.count_nonzero(b[np.minimum(np.searchsorted(b, a), len(b) - 1)] == a)) if len(b) else 0
    return inter / (len(a) + len(b) - inter)


# ---- connected components: alternating large-star / small-star -------------------------------

def symmetrize(pairs: np.ndarray) -> np.ndarray:
    """Both orientations of every pair (the map side of large-star)."""
    return np.concatenate([pairs, pairs[:, ::-1]]) if len(pairs) else EMPTY_PAIRS


def orient_down(pairs: np.ndarray) -> np.ndarray:
    """Each pair as (larger, smaller) (the map side of small-star)."""
    if len(pairs) == 0:
        return EMPTY_PAIRS
    return np.stack([pairs.max(axis=1), pairs.min(axis=1)], axis=1)


def _groups(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct pairs grouped by first column: (pairs, group start offsets, group index per pair)."""
    pairs = unique_pairs(pairs)
    start = np.flatnonzero(np.r_[True, pairs[1:, 0] != pairs[:-1, 0]])
    gid = np.repeat(np.arange(len(start)), np.diff(np.r_[start, len(pairs)]))
    return pairs, start, gid


def large_star(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Reduce side of large-star on pairs (u, v) grouped by u (both orientations present).

    Returns the new pairs (v, m(u)) for every neighbour v > u, where m(u) is the smallest of u and its
    neighbours; the labels (u, m(u)) for every u with m(u) < u (correct once converged); and a
    fingerprint (count, hash sum) of the undirected edges seen, to detect the fixed point.
    """
    if len(pairs) == 0:
        return EMPTY_PAIRS, EMPTY_PAIRS, (0, 0)
    pairs, start, gid = _groups(pairs)
    u = pairs[start, 0]
    m = np.minimum(np.minimum.reduceat(pairs[:, 1], start), u)
    up = pairs[:, 1] > pairs[:, 0]
    new = np.stack([pairs[up, 1], m[gid[up]]], axis=1)
    labelled = m < u
    labels = np.stack([u[labelled], m[labelled]], axis=1)
    return new, labels, _fingerprint(pairs[up])


def small_star(pairs: np.ndarray) -> np.ndarray:
    """Reduce side of small-star on pairs (u, v), v < u, grouped by u.

    Links u and all its smaller neighbours to the smallest of them.
    """
    if len(pairs) == 0:
        return EMPTY_PAIRS
    pairs, start, gid = _groups(pairs)
    u = pairs[start, 0]
    m = np.minimum.reduceat(pairs[:, 1], start)
    nb = pairs[:, 1] != m[gid]
    return np.concatenate([
        np.stack([pairs[nb, 1], m[gid[nb]]], axis=1),
        np.stack([u, m], axis=1),
    ])


def _fingerprint(pairs: np.ndarray) -> tuple[int, int]:
    if len(pairs) == 0:
        return 0, 0
    v = pairs.view(U64)
    with np.errstate(over="ignore"):
        h = fmix64(v[:, 0] * U64(0x9E3779B97F4A7C15) + fmix64(v[:, 1]))
        return len(pairs), int(h.sum(dtype=U64))


def connected_components(pairs: np.ndarray, max_rounds: int = 200) -> np.ndarray:
    """Single-partition reference: (node, root) for every node of a pair whose root is not itself.

    Runs the same large-star / small-star steps as the distributed version, on one partition.
    """
    cur = unique_pairs(orient_down(pairs))
    prev = None
    for _ in range(max_rounds):
        new, labels, fp = large_star(symmetrize(cur))
        if fp == prev:
            return labels
        prev = fp
        cur = small_star(orient_down(new))
    raise RuntimeError(f"connected components did not converge in {max_rounds} rounds")
