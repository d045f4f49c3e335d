"""Registry of the stage types a spec may name, imported lazily.

Each entry is ``"module:Class"``: validating a spec imports only the stage modules it names, and a
stage module keeps its heavy imports (Ray, models) inside ``setup``/``apply``, so validation never
imports Ray, torch, fastText or Presidio. A built-in stage is one line here; a stage of one's own needs no
line: a spec names it as ``module:Class``, or an installed package declares it under the ``tokenmill.stages``
entry points (:mod:`pipeline.stages.custom`).
"""

from __future__ import annotations

import importlib

from pipeline.stages.base import DatasetStage, FilterParams, FilterStage, Stage, StageContext, StageParams, Verdict
from pipeline.stages.custom import (
    ENTRY_POINT_GROUP,
    StageClass,
    StageLookupError,
    entry_point_class,
    installed,
    is_reference,
    reference_class,
)

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
    """The class of stage type ``name``: a built-in, then an installed entry point, then a ``module:Class``.

    KeyError for a plain name nobody declares; :class:`StageLookupError` (one line) for a stage that cannot be
    used: an import that fails, a class that is not a stage, an entry point clashing with a built-in or another."""
    if is_reference(name):
        return reference_class(name)
    if name in REGISTRY:
        entry_point_class(name, builtin=True)  # refuses an installed stage that takes a built-in's name
        module, _, attr = REGISTRY[name].partition(":")
        return getattr(importlib.import_module(module), attr)
    found = entry_point_class(name, builtin=False)
    if found is None:
        raise KeyError(name)
    return found


def known_stages() -> list[str]:
    """Every plain stage name a spec may use, sorted: the built-ins and the installed entry points."""
    return sorted(set(REGISTRY) | set(installed()))


__all__ = [
    "ENTRY_POINT_GROUP", "REGISTRY", "DatasetStage", "FilterParams", "FilterStage", "Stage", "StageContext",
    "StageLookupError", "StageParams", "Verdict", "known_stages", "stage_class",
]
