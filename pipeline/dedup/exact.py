"""Exact dedup: one document per normalized text, across every input file, on Ray.

The text is normalized (NFC, whitespace runs collapsed to one space, optionally case-folded) and
hashed to 128 bits (BLAKE2b). Hash rows (hash, ord, id) are hash-partitioned across Ray tasks; in
each partition the copy with the smallest ``ord`` (the earliest in input order) is kept, the others
are dropped with reason ``exact_duplicate`` and the kept copy's id as ``kept_id``. The kept hashes are written
to ``{output_dir}/index/exact_dedup/`` so a later job given ``dedup_against`` drops documents
already published (``exact_duplicate_of_published``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.dedup.exact_config import NAME, ExactDedupParams
from pipeline.dedup.stage import DedupStage
from pipeline.stages.recorder import Recorder

if TYPE_CHECKING:
    from ray.data import Dataset


class ExactDedup(DedupStage):
    name = NAME
    Params = ExactDedupParams
    params: ExactDedupParams

    def index_params(self) -> dict[str, Any]:
        return self.params.index_params()

    def apply(self, ds: Dataset, recorder: Recorder) -> Dataset:
        from pipeline.dedup.exact_tasks import exact_dedup  # imports Ray: validating a spec must not

        return exact_dedup(self.params, self.ctx, ds, recorder)
