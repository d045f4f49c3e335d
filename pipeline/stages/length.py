"""Drop documents outside a character-length window (cheap guard before costly stages)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from pipeline.documents import Doc
from pipeline.stages.base import FilterStage


class LengthParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_chars: int = Field(1, ge=0)
    max_chars: int | None = Field(None, gt=0)


class LengthFilter(FilterStage):
    name = "length"
    Params = LengthParams

    def filter(self, doc: Doc) -> bool | str:
        n = len(doc["text"])
        if n < self.params.min_chars:
            return "too_short"
        if self.params.max_chars is not None and n > self.params.max_chars:
            return "too_long"
        return True
