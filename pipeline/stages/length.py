"""Drop documents outside a character-length window (cheap guard before costly stages).

Its score is ``chars``, the document's length in characters: in annotate mode its distribution in
``stats.json`` shows where ``min_chars`` / ``max_chars`` would cut.
"""

from __future__ import annotations

from pydantic import Field

from pipeline.documents import Doc
from pipeline.stages.base import FilterParams, FilterStage, Verdict


class LengthParams(FilterParams):
    min_chars: int = Field(1, ge=0)
    max_chars: int | None = Field(None, gt=0)


class LengthFilter(FilterStage):
    name = "length"
    Params = LengthParams
    params: LengthParams

    def filter(self, doc: Doc) -> Verdict:
        n = len(doc["text"])
        scores: dict[str, float] = {"chars": n}
        if n < self.params.min_chars:
            return Verdict(False, "too_short", scores)
        if self.params.max_chars is not None and n > self.params.max_chars:
            return Verdict(False, "too_long", scores)
        return Verdict(True, None, scores)
