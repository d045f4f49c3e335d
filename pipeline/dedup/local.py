"""near_dedup's decisions computed in one process, with the same functions the Ray tasks call.

For evaluation and benchmarks: it exposes the intermediate pairs (the stage does not) and needs no
Ray. Documents are numbered by their position, which plays the role of ``ord``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.minhash import band_keys
from pipeline.dedup import graph as g
from pipeline.dedup.near_config import NearConfig


@dataclass
class LocalResult:
    candidates: np.ndarray  # (n, 2) pairs from shared band keys
    edges: np.ndarray  # pairs kept after verification (== candidates without verify)
    labels: np.ndarray  # (node, root) for every document that is not its component's root

    def removed(self) -> np.ndarray:
        return np.sort(self.labels[:, 0])


def near_dedup_local(texts: list[str], cfg: NearConfig, verify: bool = True, max_bucket: int = 64
                     ) -> LocalResult:
    sigs, counts = cfg.sign(texts)
    has = np.flatnonzero(counts > 0)
    keys = band_keys(sigs[has], cfg.bands, cfg.rows)
    cand = g.bucket_pairs(keys.ravel(), np.repeat(has, cfg.bands).astype(np.int64), max_bucket)
    edges = cand
    if verify and len(cand):
        nodes = np.unique(cand)
        sets = dict(zip(nodes.tolist(), cfg.shingle_sets([texts[i] for i in nodes]), strict=True))
        ok = np.array([g.jaccard_sorted(sets[int(x)], sets[int(y)]) >= cfg.threshold for x, y in cand])
        edges = cand[ok]
    return LocalResult(cand, edges, g.connected_components(edges))
