"""Verdicts that annotate-mode filters stored in ``meta["filters"]``, read back in pipeline order.

One function decides which stored verdict drops a document, shared by ``tokenmill report`` (what a filter-mode
run *would* drop) and the ``stored_filters`` stage (a later job that drops by the stored verdicts): the report's
prediction and the later job's drops cannot drift apart.

A filter-mode run drops a document at the first filter that fails, and later filters never see it; so a reason's
count "in order" is the number of documents whose FIRST failing filter (by stage position ``at``) gave it. The
count "alone" (every document a rule fails, whatever ran before) is what the threshold of one rule controls.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def stored_verdicts(meta: Any) -> dict[str, dict[str, Any]]:
    """``meta["filters"]`` ordered by stage position (``at``, then name); {} when the document has none."""
    if isinstance(meta, str):
        try:
            meta = json.loads(meta) if meta else {}
        except ValueError:
            return {}
    filters = meta.get("filters") if isinstance(meta, dict) else None
    if not isinstance(filters, dict):
        return {}
    good = {k: v for k, v in filters.items() if isinstance(v, dict) and "keep" in v}
    return dict(sorted(good.items(), key=lambda kv: (_at(kv[1]), kv[0])))


def _at(verdict: dict[str, Any]) -> int:
    at = verdict.get("at")
    return at if isinstance(at, int) else 1 << 30


def failures(verdicts: dict[str, dict[str, Any]], only: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """Every ``(filter, reason)`` a document fails, in pipeline order, restricted to ``only`` when given."""
    wanted = None if only is None else set(only)
    out = []
    for name, v in verdicts.items():
        if (wanted is None or name in wanted) and not v.get("keep", True):
            out.append((name, str(v.get("reason") or name)))
    return out


def first_failure(verdicts: dict[str, dict[str, Any]], only: Iterable[str] | None = None) -> tuple[str, str] | None:
    """The ``(filter, reason)`` that drops the document in a filter-mode run, or None when it is kept."""
    fails = failures(verdicts, only)
    return fails[0] if fails else None
