"""Pieces of JSON schema for the rules across fields that pydantic checks in a validator: the OpenAPI schema states
them too, so a client (and the API's fuzz test) knows a body is refused before sending it."""

from __future__ import annotations

from typing import Any


def given(field: str, kind: str) -> dict[str, Any]:
    """``field`` is given, as a ``kind`` (a null field is one not given)."""
    return {"required": [field], "properties": {field: {"type": kind}}}
