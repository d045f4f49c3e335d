"""A PII span: what detection finds and redaction replaces.

A module of its own so that the detector, the NER mode and the validity rules share it without importing
each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entity:
    """A PII span ``text[start:end]`` of Presidio entity type ``type``."""

    start: int
    end: int
    type: str
    score: float

    def as_meta(self) -> dict[str, object]:
        return {"start": self.start, "end": self.end, "type": self.type, "score": round(self.score, 4)}
