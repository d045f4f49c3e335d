"""``stored_filters``: drop documents by the verdicts an annotate-mode job stored, without recomputing them.

Read the first job's documents back with ``format: documents`` (ids and ``meta`` kept whole), then::

    - {type: stored_filters}                                   # every stored verdict, in pipeline order
    - {type: stored_filters, params: {filters: [lid, gopher_quality],
                                      rules: [{filter: gopher_quality, score: symbol_word_ratio, max: 0.05}]}}

A document is dropped with the reason its first failing stored verdict names (``gopher_quality:word_count``),
exactly the reason and the count ``tokenmill report`` predicted; ``rules`` re-threshold a stored score after
a look at the report (reason ``<filter>:<score>``). A document without a stored verdict for a named filter
is kept and counted as ``missing:<filter>``: the stage cannot judge what was never scored.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from pipeline.documents import Doc
from pipeline.filters.annotations import first_failure, stored_verdicts
from pipeline.stages.base import FilterParams, FilterStage, StageParams, Verdict


def _bounded_schema(schema: dict[str, Any]) -> None:
    """:meth:`ScoreRule._bounded` in the JSON schema: a ``min`` or a ``max`` that is not null."""
    schema["anyOf"] = [{"required": [bound], "properties": {bound: {"type": "number"}}} for bound in ("min", "max")]


class ScoreRule(StageParams):
    """Keep a document only when its stored score ``filter.scores[score]`` is within ``[min, max]``."""

    model_config = ConfigDict(json_schema_extra=_bounded_schema)

    filter: str
    score: str
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _bounded(self) -> ScoreRule:
        if self.min is None and self.max is None:
            raise ValueError("a rule needs min or max")
        return self


class StoredFiltersParams(FilterParams):
    #: the stored filters whose verdicts apply (None: every one a document carries)
    filters: list[str] | None = None
    rules: list[ScoreRule] = []


class StoredFilters(FilterStage):
    name: ClassVar[str] = "stored_filters"
    Params: ClassVar[type[BaseModel]] = StoredFiltersParams
    params: StoredFiltersParams

    def filter(self, doc: Doc) -> bool | str | Verdict:
        meta = doc.get("meta")
        verdicts = stored_verdicts(meta)
        for name in self.params.filters or ():
            if name not in verdicts:
                self.count(f"missing:{name}")
        failed = first_failure(verdicts, self.params.filters)
        if failed is not None:
            return failed[1]
        for rule in self.params.rules:
            value = verdicts.get(rule.filter, {}).get("scores", {}).get(rule.score)
            if not isinstance(value, int | float):
                self.count(f"missing:{rule.filter}.{rule.score}")
                continue
            if (rule.min is not None and value < rule.min) or (rule.max is not None and value > rule.max):
                return Verdict(False, f"{rule.filter}:{rule.score}", {rule.score: float(value)})
        return True

