"""Unicode NFC, line endings, and trimming: the canonical text every later stage hashes and counts.

A text left with nothing visible (whitespace and zero-width characters only) is dropped as ``empty_text``,
by the same test and under the same reason as in the readers.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict

from pipeline.documents import Doc, Drop, is_blank
from pipeline.stages.base import Stage


class NormalizeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    form: Literal["NFC", "NFD", "NFKC", "NFKD"] = "NFC"
    strip: bool = True


class Normalize(Stage):
    name = "normalize"
    Params = NormalizeParams
    params: NormalizeParams

    def process(self, docs: list[Doc]) -> Iterator[Doc | Drop]:
        for doc in docs:
            segments = doc.get("segments")
            if segments:  # SFT: normalize each part, keep the prompt/response split
                parts = [[self._clean(t), train] for t, train in json.loads(segments)]
                doc["segments"] = json.dumps(parts, ensure_ascii=False)
                doc["text"] = "".join(t for t, _ in parts)
                yield doc
                continue
            text = self._clean(doc["text"])
            if self.params.strip:
                text = text.strip()
            if is_blank(text):
                yield Drop(doc, "empty_text")
                continue
            doc["text"] = text
            yield doc

    def _clean(self, text: str) -> str:
        return unicodedata.normalize(self.params.form, text.replace("\r\n", "\n").replace("\r", "\n"))
