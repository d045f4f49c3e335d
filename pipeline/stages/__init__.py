"""Registry of stage types a spec may name. Add a stage by importing its class here."""

from __future__ import annotations

from pipeline.stages.base import DatasetStage, Drop, FilterStage, Stage, StageContext
from pipeline.stages.exact_dedup import ExactDedup
from pipeline.stages.length import LengthFilter
from pipeline.stages.near_dedup import NearDedup
from pipeline.stages.normalize import Normalize

StageClass = type[Stage] | type[DatasetStage]

STAGES: dict[str, StageClass] = {
    cls.name: cls
    for cls in (
        Normalize,
        LengthFilter,
        ExactDedup,
        NearDedup,
    )
}

__all__ = ["STAGES", "DatasetStage", "Drop", "FilterStage", "Stage", "StageContext"]
