"""What the two dedup stages share: documents removed in place, and earlier outputs to dedup against."""

from __future__ import annotations

from typing import Any

from pipeline.dedup.index import open_sources
from pipeline.stages.base import DatasetStage


class DedupStage(DatasetStage):
    """A dedup stage; ``dedup_against`` names earlier outputs whose index (built with the same
    :meth:`index_params`) the new documents must not repeat."""

    reorders = False  # documents are removed in place: blocks keep their order
    path_params = ("dedup_against",)

    def index_params(self) -> dict[str, Any]:
        """The parameters an index must have been built with to be deduplicated against (its meta's)."""
        raise NotImplementedError

    def preflight(self) -> None:
        open_sources(self.params.dedup_against, self.name, self.index_params())
