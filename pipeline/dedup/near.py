"""Near dedup: MinHash-LSH on Ray, connected components, one document kept per component.

1. Per block of documents, MinHash signatures (kernels.minhash) and one key per LSH band.
2. Band rows (key, ord) are hash-partitioned by key; each partition turns shared keys into candidate
   pairs (all pairs of a bucket up to ``max_bucket`` documents, a star beyond).
3. With ``verify`` (default), each pair's exact Jaccard on the shingle hashes is checked in two hops
   through the blocks that hold its two documents (texts never move; one document's shingle set
   travels to the other's block), and pairs below ``threshold`` are dropped.
4. Connected components of the kept pairs, distributed (large-star / small-star, pipeline.dedup.graph).
5. In every component the document with the smallest ``ord`` is kept; the others are dropped with
   reason ``near_duplicate`` and the id of the kept document as ``kept_id``.

The band keys, signatures and ids of the kept documents are written to
``{output_dir}/index/near_dedup/``; a later job with ``dedup_against`` adds those published documents
to the graph as nodes that sort first, so new documents in their component are dropped with
``near_duplicate_of_published`` (verified against the stored signatures: estimated Jaccard).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.dedup.near_config import NAME, NearConfig, NearDedupParams
from pipeline.dedup.stage import DedupStage
from pipeline.stages.recorder import Recorder

if TYPE_CHECKING:
    from ray.data import Dataset


class NearDedup(DedupStage):
    name = NAME
    Params = NearDedupParams
    params: NearDedupParams

    def index_params(self) -> dict[str, Any]:
        return NearConfig.from_params(self.params).index_params()

    def apply(self, ds: Dataset, recorder: Recorder) -> Dataset:
        from pipeline.dedup.near_tasks import near_dedup  # imports Ray: validating a spec must not

        return near_dedup(self.params, self.ctx, ds, recorder)
