"""What the two dedup stages share: documents removed in place, and earlier outputs to dedup against."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.dedup.index import open_sources
from pipeline.stages.base import DatasetStage

if TYPE_CHECKING:  # each stage imports only its own config
    from pipeline.dedup.exact_config import ExactDedupParams
    from pipeline.dedup.near_config import NearDedupParams


class DedupStage(DatasetStage):
    """A dedup stage; ``dedup_against`` names earlier outputs whose index (built with the same
    :meth:`index_params`) the new documents must not repeat."""

    reorders = False  # documents are removed in place: blocks keep their order
    path_params = ("dedup_against",)
    params: ExactDedupParams | NearDedupParams

    def index_params(self) -> dict[str, Any]:
        """The parameters an index must have been built with to be deduplicated against (its meta's)."""
        raise NotImplementedError

    def preflight(self) -> None:
        open_sources(self.params.dedup_against, self.name, self.index_params())
