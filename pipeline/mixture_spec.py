"""The mixture spec: which shard sets to blend, by weight or token budget, with caps on repetition.

One pydantic model for ``tokenmill mix SPEC`` and ``POST /v1/mixtures``. Pure schema: reading the sources'
manifests and planning the samples is :mod:`pipeline.mixture_plan`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.nesting import TooDeep, load_yaml
from pipeline.problems import Problem, SpecError, parse_model, validation_error
from pipeline.schema_rules import given

#: 10^15 tokens: far beyond any corpus, and exact as a float
MAX_TOKENS = 10**15


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


#: the kind of the problem of a source whose name an earlier source has
DUPLICATE_NAME = "duplicate_name"
#: the fields that name a source's shard set: exactly one is given
REFERENCES = ("path", "job", "schedule")


def _source_rules(schema: dict[str, Any]) -> None:
    """:meth:`SourceSpec._one_of`'s rules in the JSON schema (a null field is one not given)."""
    schema["allOf"] = [{"oneOf": [given(k, "string") for k in REFERENCES]},
                       {"oneOf": [given("weight", "number"), given("tokens", "integer")]},
                       {"anyOf": [{"properties": {"version": {"type": "null"}}}, given("schedule", "string")]}]
    for option in schema["properties"]["version"]["anyOf"]:
        if option.get("type") == "integer":
            option["minimum"] = 1


class SourceSpec(_Strict):
    """A shard set, named by exactly one of ``path`` (a folder, an object-store URI or an http(s) URL),
    ``job`` or ``schedule`` (a control-plane reference, resolved and pinned when the mixture is made), with
    exactly one of ``weight`` (share of the mixture's tokens) and ``tokens`` (an absolute budget)."""

    model_config = ConfigDict(json_schema_extra=_source_rules)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    path: str | None = Field(None, min_length=1, max_length=4096)
    job: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    schedule: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    version: int | Literal["latest"] | None = Field(None, description="with schedule: a number or latest")
    weight: float | None = Field(None, gt=0, le=1e6)
    tokens: int | None = Field(None, gt=0, le=MAX_TOKENS)
    max_epochs: float | None = Field(None, gt=0, le=1e6, description="cap on how often the source is read")

    @model_validator(mode="after")
    def _one_of(self) -> SourceSpec:
        refs = [k for k in REFERENCES if getattr(self, k) is not None]
        if len(refs) != 1:
            raise ValueError("give exactly one of path, job, schedule")
        if self.version is not None and self.schedule is None:
            raise ValueError("version: only with schedule")
        if isinstance(self.version, int) and self.version < 1:
            raise ValueError("version: must be >= 1 or latest")
        if (self.weight is None) == (self.tokens is None):
            raise ValueError("give exactly one of weight, tokens")
        return self

    def reference(self) -> str:
        """The source as given, for messages."""
        if self.path is not None:
            return self.path
        if self.job is not None:
            return f"job {self.job}"
        return f"schedule {self.schedule} version {self.version or 'latest'}"


class MixtureSpec(_Strict):
    name: str = Field("mixture", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    sources: list[SourceSpec] = Field(min_length=1, max_length=256)
    total_tokens: int | None = Field(None, gt=0, le=MAX_TOKENS, description="default: as much as the weighted "
                                     "sources give with each read at most max_epochs (default 1) times")
    #: at most 2**53 - 1: a JSON number any client reads exactly (a JSON schema checker compares in doubles too)
    seed: int = Field(0, ge=0, le=(1 << 53) - 1)
    fill: Literal["error", "redistribute"] = Field("error", description="a source over max_epochs: an error, "
                                                   "or its shortfall spread over the other weighted sources")

    @model_validator(mode="after")
    def _unique(self) -> MixtureSpec:
        """Names unique (a rule no JSON schema can state: the API's 422 names the later source's ``name``)."""
        seen: set[str] = set()
        for i, s in enumerate(self.sources):
            if s.name in seen:
                raise validation_error(type(self).__name__, [Problem(
                    ("sources", i, "name"), f"the name {s.name!r} is used twice", DUPLICATE_NAME)])
            seen.add(s.name)
        return self


def parse_mixture_spec(data: Any) -> MixtureSpec:
    """Validate a spec given as a mapping; :class:`SpecError` names every field that is wrong."""
    return parse_model(MixtureSpec, data)


def load_mixture_spec(path: str | Path) -> MixtureSpec:
    """A spec from a YAML or JSON file; a relative local ``path`` resolves against the file's folder."""
    path = Path(path)
    try:
        data = load_yaml(path.read_text())  # a JSON file too: YAML's superset
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([Problem((), f"{path}: cannot read: {exc}", "spec_file")]) from None
    except TooDeep as exc:
        raise SpecError([Problem((), exc.at(path), "spec_file")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise SpecError([Problem((), f"{path}{at}: {getattr(exc, 'problem', None) or exc}", "spec_file")]) from None
    spec = parse_mixture_spec(data)
    base = path.resolve().parent
    for s in spec.sources:
        if s.path is not None and "://" not in s.path and not Path(s.path).is_absolute():
            s.path = str((base / s.path).resolve())
    return spec
