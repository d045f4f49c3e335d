"""API keys: how they look, how they are stored, how a request's bearer token is checked.

A key is ``tm_<id>_<secret>``: ``id`` (12 hex characters) is public and finds the row, ``secret`` is 256 random
bits (:func:`secrets.token_urlsafe`) shown once, at creation. Only ``sha256(secret)`` is stored. A fast
hash is enough here, unlike for passwords: a password hash (bcrypt, argon2) is slow to make guessing a
low-entropy secret expensive, and a 256-bit random secret cannot be guessed at any speed (OWASP's
Password Storage Cheat Sheet makes the same distinction for random tokens). The comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

PREFIX = "tm"
_KEY = re.compile(r"^tm_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class NewKey:
    id: str
    secret_hash: str
    #: the whole key, to show once
    token: str


def generate() -> NewKey:
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return NewKey(key_id, hash_secret(secret), f"{PREFIX}_{key_id}_{secret}")


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse(token: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed key, else None."""
    m = _KEY.match(token.strip())
    return (m.group(1), m.group(2)) if m else None


def matches(secret: str, secret_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), secret_hash)
