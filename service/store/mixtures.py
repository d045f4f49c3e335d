"""The ``mixtures`` table: a mixture is stored once per distinct mixture file (its id comes from the file's
sha256), so posting the same spec over the same pinned sources again returns the mixture already made."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.store.models import StoredMixture
from service.store.repo import NotFound


def mixture_id(document: str) -> str:
    return hashlib.sha256(document.encode()).hexdigest()[:16]


def save_mixture(s: Session, *, name: str, spec: dict[str, Any], document: str, samples: int, tokens: int,
                 api_key_id: str | None = None) -> tuple[StoredMixture, bool]:
    """(the mixture, whether it is new); the same document twice is one mixture."""
    mid = mixture_id(document)
    existing = s.get(StoredMixture, mid)
    if existing is not None:
        return existing, False
    row = StoredMixture(id=mid, name=name, spec=spec, document=document,
                        sha256=hashlib.sha256(document.encode()).hexdigest(), samples=samples, tokens=tokens,
                        api_key_id=api_key_id)
    try:
        with s.begin_nested():  # two identical requests at once: the primary key decides
            s.add(row)
            s.flush()
    except IntegrityError:
        return get_mixture(s, mid), False
    return row, True


def get_mixture(s: Session, mixture_id_: str) -> StoredMixture:
    row = s.get(StoredMixture, mixture_id_)
    if row is None:
        raise NotFound(f"no mixture {mixture_id_!r}")
    return row


def list_mixtures(s: Session, limit: int = 500) -> Sequence[StoredMixture]:
    return s.scalars(select(StoredMixture).order_by(StoredMixture.created_at.desc(), StoredMixture.id)
                     .limit(limit)).all()
