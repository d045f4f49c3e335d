"""Secret spec fields (issue 37): declared once, in the schema; found by one walk wherever a spec is shown.

The API's responses and the run folder: tests/test_service_api.py and tests/test_service_schedules.py; a real
PII job's files, logs and events: tests/test_service_e2e.py.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from pipeline import secret_fields
from pipeline.card.collect import spec_for_card
from pipeline.pii.stage import PiiParams
from pipeline.secret_fields import REDACTED, Secret
from pipeline.spec import parse_spec
from pipeline.stages import REGISTRY
from pipeline.stages.base import Stage, StageParams

SALT = "pepper-0123456789-abcdef"


class Auth(BaseModel):
    user: str
    token: Secret


class CredentialParams(StageParams):
    """A stage that takes a credential, nested in a list of models: a secret by its type alone."""

    endpoint: str = "https://example.invalid"
    auth: list[Auth] = []


class CredentialStage(Stage):
    name = "credential_probe"
    Params = CredentialParams


@pytest.fixture
def credential_stage(monkeypatch):
    monkeypatch.setitem(REGISTRY, "credential_probe", f"{__name__}:CredentialStage")


def _spec() -> dict:
    return {"name": "s", "inputs": [{"path": "/in/*.jsonl"}], "output": {"path": "/out"},
            "stages": [{"type": "pii", "params": {"salt": SALT, "actions": {"EMAIL_ADDRESS": "hash"}}},
                       {"type": "credential_probe", "params": {"auth": [{"user": "u", "token": "t0ken"}]}},
                       {"type": "normalize"}]}


def test_the_salt_is_declared_secret_in_the_stage_schema():
    salt = PiiParams.model_json_schema()["properties"]["salt"]
    assert salt["writeOnly"] is True and salt[secret_fields.MARK] is True


def test_every_declared_secret_is_found_and_redacted_in_the_card_spec(credential_stage):
    spec = parse_spec(_spec()).model_dump(mode="json")
    assert secret_fields.secrets_of(spec) == {("stages", 0, "params", "salt"): SALT,
                                              ("stages", 1, "params", "auth", 0, "token"): "t0ken"}
    card = spec_for_card(spec)
    assert card["stages"][0]["params"]["salt"] == REDACTED
    assert card["stages"][1]["params"]["auth"] == [{"user": "u", "token": REDACTED}]
    assert spec["stages"][0]["params"]["salt"] == SALT  # the spec itself is not changed


def test_redact_restore_and_keep_stored(credential_stage):
    spec = _spec()
    values = secret_fields.secrets_of(spec)
    shown = secret_fields.redact(spec)
    assert secret_fields.secrets_of(shown) == dict.fromkeys(values, REDACTED)
    assert secret_fields.restore(shown, secret_fields.from_json(secret_fields.to_json(values))) == spec
    assert [p.loc for p in secret_fields.placeholder_problems(shown)] == list(values)
    shown["stages"][1]["params"]["auth"][0]["token"] = "new-token"  # a new value replaces, the placeholder keeps
    kept = secret_fields.keep_stored(shown, spec)
    assert secret_fields.secrets_of(kept) == {("stages", 0, "params", "salt"): SALT,
                                              ("stages", 1, "params", "auth", 0, "token"): "new-token"}
    assert secret_fields.placeholder_problems(kept) == []
    # a stored spec is walked as it is: an unknown stage, a malformed part or an empty salt hold no secret
    odd = {"stages": [{"type": "gone"}, {"type": "pii", "params": "x"}, {"type": "pii", "params": {"salt": ""}}],
           "inputs": "x"}
    assert secret_fields.secrets_of(odd) == {} and secret_fields.redact(odd) == odd
