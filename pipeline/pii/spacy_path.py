"""Whether a path holds a spaCy pipeline: checked before a job starts, without importing spaCy."""

from __future__ import annotations

from pathlib import Path

from pipeline.problems import ParamError


def check_pipeline(path: str | Path) -> None:
    """Raise :class:`~pipeline.problems.ParamError` (a ValueError) unless ``path`` is a spaCy pipeline directory
    (what ``nlp.to_disk`` writes)."""
    p = Path(path)
    if not (p / "config.cfg").is_file() or not (p / "meta.json").is_file():
        raise ParamError("spacy_model", f"{p} is not a spaCy pipeline directory (no config.cfg and meta.json)")
