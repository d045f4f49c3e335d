"""Request bodies in JSON, checked where :class:`service.api.edge.Edge` has read them, before FastAPI parses them.

FastAPI answers a ``JSONDecodeError`` with a 422 but any other failure of ``json.loads`` with a 400 of its own
wording: bytes that are not UTF-8, an integer of more than 4,300 digits, and a ``RecursionError`` for 1,000
nested ``[`` (or a 500 on the way). Here every broken body is one 422 problem (``{loc, msg, type}``, as
:mod:`service.api.yaml_body`'s), and one nested deeper than :data:`pipeline.nesting.MAX_DEPTH` is refused
before the parser sees it.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline import nesting

#: ``type`` of the problem of a body that is not JSON
KIND = "json_invalid"


def is_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this type as JSON: none given, ``application/json`` or ``.../*+json``."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return not media or media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def problem(body: bytes) -> dict[str, Any] | None:
    """The one problem that stops ``body`` from being read as JSON, or None: it parses."""
    try:
        nesting.check_json(body)
        json.loads(body)
    except nesting.TooDeep as exc:
        return _problem(str(exc), nesting.KIND)
    except json.JSONDecodeError as exc:
        return _problem(f"line {exc.lineno}, column {exc.colno}: {exc.msg}")
    except UnicodeDecodeError as exc:
        return _problem(f"not UTF-8 ({exc.reason} at byte {exc.start})")
    except ValueError as exc:  # an integer of more than 4,300 digits: Python's advice to itself left out
        return _problem(f"not valid JSON: {str(exc).split(';', 1)[0]}")
    return None


def _problem(msg: str, kind: str = KIND) -> dict[str, Any]:
    return {"loc": ["body"], "msg": msg, "type": kind}
