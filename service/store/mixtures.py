"""The ``mixtures`` table: a mixture is stored once per distinct mixture file (its id comes from the file's
sha256), so posting the same spec over the same pinned sources again returns the mixture already made."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.store.models import DEFAULT_TEAM, StoredMixture
from service.store.repo import NotFound, owned


def mixture_id(document: str) -> str:
    return hashlib.sha256(document.encode()).hexdigest()[:16]


def save_mixture(s: Session, *, name: str, spec: dict[str, Any], document: str, samples: int, tokens: int,
                 api_key_id: str | None = None, team: str = DEFAULT_TEAM) -> tuple[StoredMixture, bool]:
    """(the mixture, whether it is new); the same document twice is one mixture. Its id comes from the file, so
    one team's mixture and another's over the same sources would share it: the team is part of the id."""
    mid = mixture_id(document if team == DEFAULT_TEAM else f"{team}\n{document}")
    existing = s.get(StoredMixture, mid)
    if existing is not None:
        return existing, False
    row = StoredMixture(id=mid, name=name, spec=spec, document=document,
                        sha256=hashlib.sha256(document.encode()).hexdigest(), samples=samples, tokens=tokens,
                        api_key_id=api_key_id, team=team)
    try:
        with s.begin_nested():  # two identical requests at once: the primary key decides
            s.add(row)
            s.flush()
    except IntegrityError:
        return get_mixture(s, mid), False
    return row, True


def get_mixture(s: Session, mixture_id_: str, team: str | None = None) -> StoredMixture:
    return owned(s.get(StoredMixture, mixture_id_), team, NotFound(f"no mixture {mixture_id_!r}"))


def list_mixtures(s: Session, limit: int = 500, team: str | None = None) -> Sequence[StoredMixture]:
    stmt = select(StoredMixture) if team is None else select(StoredMixture).where(StoredMixture.team == team)
    return s.scalars(stmt.order_by(StoredMixture.created_at.desc(), StoredMixture.id).limit(limit)).all()
