"""Registry of the stage types a spec may name, imported lazily.

Each entry is ``"module:Class"``: validating a spec imports only the stage modules it names, and a
stage module keeps its heavy imports (Ray, models) inside ``setup``/``apply``, so validation never
imports Ray, torch, fastText or Presidio. Add a stage by adding one line here.
"""

from __future__ import annotations

import importlib

from pipeline.stages.base import DatasetStage, FilterParams, FilterStage, Stage, StageContext, StageParams, Verdict

StageClass = type[Stage] | type[DatasetStage]

REGISTRY: dict[str, str] = {
    "normalize": "pipeline.stages.normalize:Normalize",
    "length": "pipeline.stages.length:LengthFilter",
    "exact_dedup": "pipeline.dedup.exact:ExactDedup",
    "near_dedup": "pipeline.dedup.near:NearDedup",
    # language and quality (pipeline/filters/)
    "lid": "pipeline.filters.lid:LanguageId",
    "gopher_quality": "pipeline.filters.gopher:GopherQuality",
    "gopher_repetition": "pipeline.filters.gopher:GopherRepetition",
    "c4": "pipeline.filters.c4:C4Quality",
    "fineweb": "pipeline.filters.fineweb:FineWebQuality",
    "quality_classifier": "pipeline.filters.quality_classifier:QualityClassifier",
    "stored_filters": "pipeline.filters.stored:StoredFilters",
    # privacy and benchmarks
    "pii": "pipeline.pii.stage:PiiStage",
    "decontaminate": "pipeline.decontam.stage:Decontaminate",
}


def stage_class(name: str) -> StageClass:
    """The class registered as ``name``; KeyError for an unknown name."""
    module, _, attr = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), attr)


__all__ = [
    "REGISTRY", "DatasetStage", "FilterParams", "FilterStage", "Stage", "StageContext", "StageParams", "Verdict",
    "stage_class",
]
