"""What happens to a detected entity: a typed placeholder, a salted hash, or nothing (presidio-anonymizer).

- ``placeholder``: ``<EMAIL_ADDRESS>`` (Presidio's ``replace`` operator);
- ``hash``: ``<EMAIL_ADDRESS:3fa2c1d9>``, the first ``hash_chars`` hex digits of HMAC-SHA256(salt, value):
  the same value gives the same token for one salt (a model still sees that two mentions are one
  person's address) and another for another salt; without the salt the value cannot be recovered by
  hashing guesses (a phone number has few enough digits to enumerate);
- ``keep``: left as is (Presidio's ``keep``), still annotated and counted.

Presidio's ``AnonymizerEngine`` rebuilds the whole text once per entity, quadratic on a long document; here
it runs on each entity's own text and the document is joined once around them.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Literal

from presidio_anonymizer import AnonymizerEngine
from presidio_anonymizer.entities import OperatorConfig, RecognizerResult

from pipeline.pii.entity import Entity

Action = Literal["placeholder", "hash", "keep"]
#: Presidio's ``Hash`` operator refuses a salt shorter than 16 bytes (128 bits); the same rule here
MIN_SALT_BYTES = 16


class Redactor:
    """Rewrites a text given its non-overlapping entities, one action per entity type."""

    def __init__(self, actions: Mapping[str, Action], default: Action = "placeholder", salt: str = "",
                 hash_chars: int = 8):
        uses_hash = default == "hash" or "hash" in actions.values()
        if uses_hash and len(salt.encode()) < MIN_SALT_BYTES:
            raise ValueError(f"salt: the hash action needs a secret salt of at least {MIN_SALT_BYTES} bytes")
        self.actions = dict(actions)
        self.default = default
        self._key = salt.encode()
        self._hash_chars = hash_chars
        self._engine = AnonymizerEngine()
        self._operators: dict[str, OperatorConfig] = {}

    def action(self, entity_type: str) -> Action:
        return self.actions.get(entity_type, self.default)

    def token(self, entity_type: str, value: str) -> str:
        """The salted hash token of ``value``."""
        digest = hmac.new(self._key, value.encode(), hashlib.sha256).hexdigest()
        return f"<{entity_type}:{digest[: self._hash_chars]}>"

    def redact(self, text: str, entities: Sequence[Entity]) -> str:
        """``text`` with each entity replaced by its action's output; ``entities`` sorted, non-overlapping."""
        parts, pos = [], 0
        for e in entities:
            if self.action(e.type) == "keep":
                continue
            value = text[e.start : e.end]
            result = self._engine.anonymize(
                text=value, analyzer_results=[RecognizerResult(e.type, 0, len(value), e.score)],
                operators={e.type: self._operator(e.type)},
            )
            parts += [text[pos : e.start], result.text]
            pos = e.end
        parts.append(text[pos:])
        return "".join(parts)

    def _operator(self, entity_type: str) -> OperatorConfig:
        op = self._operators.get(entity_type)
        if op is None:
            action = self.action(entity_type)
            if action == "hash":
                op = OperatorConfig("custom", {"lambda": lambda value: self.token(entity_type, value)})
            elif action == "keep":
                op = OperatorConfig("keep")
            else:
                op = OperatorConfig("replace", {"new_value": f"<{entity_type}>"})
            self._operators[entity_type] = op
        return op
