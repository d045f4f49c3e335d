"""The job spec: one pydantic model for the CLI and the REST API, loaded from YAML or JSON.

Pure schema: parsing a spec touches no file but the spec itself and imports only the stage modules it
names (never Ray). An invalid spec is refused with a :class:`~pipeline.problems.SpecError` holding one
:class:`~pipeline.problems.Problem` per field (its path and the reason), every field's at once; stage
parameters are validated, once, against each stage's own ``Params`` model, their errors placed below
``stages.<i>.params``. Checks that need the filesystem (inputs match files, a tokenizer file exists, an
index to dedup against) live in :mod:`pipeline.preflight`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from pipeline.problems import Problem, SpecError, problems_of, validation_error
from pipeline.stages import REGISTRY, stage_class

#: ``documents``: a tokenmill ``documents`` output (its parts, Parquet or JSONL), read with ids and ``meta`` as
#: they were, so a later job can act on what an earlier one annotated (``stored_filters``)
InputFormat = Literal["auto", "jsonl", "parquet", "text", "warc", "instruction", "chat", "documents"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputSpec(Strict):
    path: str = Field(description="a file, a folder, or a glob")
    format: InputFormat = "auto"
    text_field: str = "text"
    id_field: str = "id"
    #: for format=instruction/chat: the template that renders a record (see pipeline.readers.templates)
    template: str | None = None


class StageSpec(Strict):
    type: str
    params: dict[str, Any] = Field(default_factory=dict)

    _params: BaseModel | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _check_params(self) -> StageSpec:
        """``params`` against the stage's own ``Params`` model, each error at its field below ``params``."""
        if self.type not in REGISTRY:
            raise validation_error(type(self).__name__, [Problem(
                ("type",), f"unknown stage {self.type!r} (known: {', '.join(sorted(REGISTRY))})", "unknown_stage")],
                self.type)
        try:
            self._params = stage_class(self.type).Params.model_validate(self.params)
        except ValidationError as exc:
            raise validation_error(type(self).__name__, [p.under("params") for p in problems_of(exc)],
                                   self.params) from None
        return self

    @property
    def validated(self) -> BaseModel:
        """``params`` as the stage's ``Params`` (validated with the spec)."""
        assert self._params is not None, "a StageSpec is validated when it is made"
        return self._params


class TrainTokenizerSpec(Strict):
    vocab_size: int = Field(8192, ge=260, le=1 << 20)
    sample_docs: int = Field(20000, ge=1)
    sample_bytes: int = Field(50_000_000, ge=1000)
    min_frequency: int = Field(2, ge=1)


class TokenizerSpec(Strict):
    path: str | None = Field(None, description="a tokenizer.json to load; when absent, train one")
    train: TrainTokenizerSpec = Field(default_factory=TrainTokenizerSpec)
    add_bos: bool = False
    add_eos: bool = True
    bos_token: str = "<|bos|>"
    eos_token: str = "<|endoftext|>"
    pad_token: str = "<|pad|>"


class PackingSpec(Strict):
    seq_len: int = Field(2048, gt=0, le=1 << 20)
    method: Literal["best_fit", "concat"] = "best_fit"
    #: open sequences best-fit may keep while it waits for a document that fills them
    max_open: int = Field(1024, ge=1)
    #: documents per packing range: ranges are packed by separate Ray tasks (best-fit restarts at each
    #: boundary), so output scales with workers and stays the same for any worker count
    range_docs: int = Field(4096, ge=1)


class OutputSpec(Strict):
    path: str
    samples_per_shard: int = Field(1024, gt=0)
    write_rejected: bool = True
    overwrite: bool = False
    #: also write the kept documents (text, metadata, annotations) in ``ord`` order under ``documents/``
    documents: Literal["parquet", "jsonl"] | None = None
    #: a ``meta`` field (``lang`` after the ``lid`` stage): one shard set per value, in ``OUT/<value>/``
    #: (manifest, tokenizer, shards), sharing one tokenizer; see pipeline/output/groups.py
    split_by: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class ExecutionSpec(Strict):
    address: str | None = Field(None, description="Ray address; None starts a local Ray")
    parallelism: int | None = Field(None, ge=1, description="workers per stage; None = CPUs")
    num_cpus: int | None = Field(None, ge=1, description="CPUs for a local Ray")
    batch_size: int = Field(256, ge=1)
    seed: int = 0


class JobSpec(Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    inputs: list[InputSpec] = Field(min_length=1)
    stages: list[StageSpec] = Field(default_factory=list)
    #: ``null``: a documents-only job (``output.documents`` required): no tokenizer, no shards
    tokenizer: TokenizerSpec | None = Field(default_factory=TokenizerSpec)
    packing: PackingSpec = Field(default_factory=PackingSpec)
    output: OutputSpec
    execution: ExecutionSpec = Field(default_factory=ExecutionSpec)

    @model_validator(mode="after")
    def _check_across_stages(self) -> JobSpec:
        found: list[Problem] = []
        annotating: dict[str, int] = {}  # meta.filters key -> the first annotate-mode stage that writes it
        for i, stage in enumerate(self.stages):
            if getattr(stage.validated, "mode", None) != "annotate":
                continue
            key = stage_class(stage.type).name
            if key in annotating:  # the later verdict would silently replace the earlier one in every document
                found.append(Problem(("stages", i, "params", "mode"), (
                    f"annotate would overwrite the verdicts stages.{annotating[key]} stores in meta.filters.{key}; "
                    f"annotate with one {stage.type!r} per job (the other in filter mode, or in a job of its own)"),
                    "annotate_conflict"))
            annotating.setdefault(key, i)
        if self.tokenizer is None and self.output.documents is None:
            found.append(Problem(("tokenizer",), "null (a documents-only job) needs output.documents: parquet or jsonl",
                                 "documents_required"))
        if found:
            raise validation_error(type(self).__name__, found)
        return self

    def stage_params(self, index: int) -> BaseModel:
        """The validated ``Params`` of stage ``index`` (parsed once, when the spec was)."""
        return self.stages[index].validated

    def content_hash(self) -> str:
        """Hash of what determines the output bytes: execution settings are left out."""
        data = self.model_dump(mode="json", exclude={"execution": True, "output": {"overwrite", "path"}})
        data["execution"] = {"seed": self.execution.seed}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def parse_spec(data: Any) -> JobSpec:
    """Validate a spec given as a dict (schema only; :func:`pipeline.preflight.check_spec` checks files)."""
    if not isinstance(data, dict):
        raise SpecError.one((), "must be a mapping", "model_type")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_of(exc)) from None


def load_spec(path: str | Path) -> JobSpec:
    """Load a spec from a YAML or JSON file; relative paths (inputs, tokenizer, output, stage path
    params such as ``dedup_against``) resolve against its folder."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError.one((), f"cannot read {path}: {exc.strerror}", "spec_file") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError.one((), f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                                f"{str(exc).splitlines()[0]}", "spec_file") from None
    if isinstance(data, dict):
        base = path.resolve().parent
        for inp in data.get("inputs") or []:
            if isinstance(inp, dict) and isinstance(inp.get("path"), str):
                inp["path"] = _under(base, inp["path"])
        tok = data.get("tokenizer")
        if isinstance(tok, dict) and isinstance(tok.get("path"), str):
            tok["path"] = _under(base, tok["path"])
        out = data.get("output")
        if isinstance(out, dict) and isinstance(out.get("path"), str):
            out["path"] = _under(base, out["path"])
        _resolve_stage_paths(data.get("stages"), base)
    return parse_spec(data)


def _under(base: Path, path: str) -> str:
    """``path`` as written in a spec file: ``~`` is the user's home, a relative path is below the
    spec's folder, an absolute one or a URI (``s3://bucket/key``) stays as it is."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", path) and not path.startswith("file://"):
        return path
    return str(base / os.path.expanduser(path.removeprefix("file://")))


def _resolve_stage_paths(stages: Any, base: Path) -> None:
    """Resolve each stage's path params (``Stage.path_params``, e.g. ``dedup_against``) against ``base``.

    Absolute paths stay as they are (``base / "/abs"`` is ``/abs``); an empty string keeps meaning "none".
    Anything malformed is left alone for validation to report.
    """
    def resolve(value: Any) -> Any:
        if isinstance(value, str):
            return _under(base, value) if value else value
        if isinstance(value, list):
            return [resolve(v) if isinstance(v, str) else v for v in value]
        return value

    for stage in stages if isinstance(stages, list) else []:
        if not isinstance(stage, dict) or not isinstance(stage.get("type"), str):
            continue
        params = stage.get("params")
        if stage["type"] not in REGISTRY or not isinstance(params, dict):
            continue
        for key in stage_class(stage["type"]).path_params:
            if key in params:
                params[key] = resolve(params[key])
