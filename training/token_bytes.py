"""UTF-8 bytes per token id, so that a loss in nats per token becomes bits per byte of text.

Bits per byte compares models whose tokenizers differ (a token is not a unit two vocabularies share; a byte is):
``bpb = sum(nll nats) / ln 2 / sum(bytes of the target tokens)``. For the byte-level BPE tokenizers the pipeline
trains (``tokenizers`` json, GPT-2's byte-to-character alphabet) every vocabulary entry is a string over that
alphabet, one character per byte, so its byte length is its character count, exactly, even for a token that
holds only part of a multi-byte character (which ``decode`` would show as U+FFFD). Added tokens (BOS, EOS,
pad) stand for no text and count 0 bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import storage


class TokenBytesError(ValueError):
    """A tokenizer whose tokens' bytes cannot be read exactly; the message says which and why."""


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable bytes stand for themselves, the rest are
    shifted to 256 + k in byte order (what ``pre_tokenizers.ByteLevel`` uses)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars: dict[str, int] = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _parse(text: str | bytes, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenBytesError(f"tokenizer: {where} does not parse: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise TokenBytesError(f"tokenizer: {where} is not a tokenizers JSON file (no model)")
    return data


def _is_byte_level(data: dict[str, Any]) -> bool:
    parts = [data.get("pre_tokenizer"), data.get("decoder")]
    text = json.dumps(parts)
    return '"ByteLevel"' in text


def token_byte_lengths(tokenizer_json: str | Path) -> np.ndarray:
    """int64 array indexed by token id: the UTF-8 byte length of that token's text (0 for added tokens and
    for ids the vocabulary does not use). ``tokenizer_json``: a local path or a storage URI (``s3://...``).
    Raises :class:`TokenBytesError` for a file that cannot be read or a tokenizer that is not byte-level BPE,
    since other tokenizers' token texts are not exact byte strings."""
    where = str(tokenizer_json)
    try:
        text = storage.read_text(where) if "://" in where else Path(where).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenBytesError(f"tokenizer: cannot read {where}: {exc}") from None
    return token_byte_lengths_of(text, where)


def token_byte_lengths_of(text: str | bytes, where: str = "tokenizer.json") -> np.ndarray:
    """:func:`token_byte_lengths` of a tokenizer's JSON text (fetched by a shard source, say); ``where`` names
    it in errors."""
    tokenizer_json = where
    data = _parse(text, where)
    model = data["model"]
    if model.get("type") != "BPE" or not _is_byte_level(data):
        raise TokenBytesError(f"tokenizer: {tokenizer_json} is not a byte-level BPE tokenizer: bits per byte "
                              "needs each token's exact bytes")
    vocab: dict[str, int] = model.get("vocab") or {}
    added = {int(t["id"]) for t in data.get("added_tokens") or []}
    size = max([*vocab.values(), *added, -1]) + 1
    lengths = np.zeros(size, dtype=np.int64)
    alphabet = byte_level_alphabet()
    for token, tid in vocab.items():
        if tid in added:
            continue
        stray = next((c for c in token if c not in alphabet), None)
        if stray is not None:
            raise TokenBytesError(f"tokenizer: {tokenizer_json}: token {tid} ({token!r}) holds {stray!r}, which is "
                                  "not in the byte-level alphabet")
        lengths[tid] = len(token)
    return lengths
