"""The job spec: one pydantic model for the CLI and the REST API, loaded from YAML or JSON.

Pure schema: parsing a spec touches no file but the spec itself and imports only the stage modules it
names (never Ray). An invalid spec is refused with a :class:`~pipeline.problems.SpecError` holding one
:class:`~pipeline.problems.Problem` per field (its path and the reason), every field's at once; stage
parameters are validated, once, against each stage's own ``Params`` model, their errors placed below
``stages.<i>.params``. Checks that need the filesystem (inputs match files, a tokenizer file exists, an
index to dedup against) live in :mod:`pipeline.preflight`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, PrivateAttr, ValidationError, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from pipeline.nesting import Loader, TooDeep, check_json
from pipeline.problems import SPEC_FILE, Loc, Problem, SpecError, parse_model, problems_of, validation_error
from pipeline.schema_rules import given
from pipeline.stages import StageLookupError, known_stages, stage_class
from pipeline.stages.custom import REFERENCE, StageClass, next_to_spec

#: ``documents``: a tokenmill ``documents`` output (its parts, Parquet or JSONL), read with ids and ``meta`` as
#: they were, so a later job can act on what an earlier one annotated (``stored_filters``)
InputFormat = Literal["auto", "jsonl", "parquet", "text", "warc", "instruction", "chat", "documents"]


#: ``inputs[].max_record_bytes`` when a spec does not set it: a 50 MB line still passes
DEFAULT_MAX_RECORD_BYTES = 64 << 20


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputSpec(Strict):
    path: str = Field(description="a file, a folder, or a glob")
    format: InputFormat = "auto"
    text_field: str = "text"
    id_field: str = "id"
    #: for format=instruction/chat: the template that renders a record (see pipeline.readers.templates)
    template: str | None = None
    #: the most one record may cost (a JSONL line, a text file, a WARC record, a Parquet value), in bytes after
    #: decompression: a record over it is a counted ``record_too_large`` drop, read past in bounded memory, so a
    #: small compressed file that inflates to one huge line cannot take a worker's memory (pipeline/readers/bounded.py)
    max_record_bytes: int = Field(DEFAULT_MAX_RECORD_BYTES, gt=0)
    #: read only the first N documents of this input, its files in order (``tokenmill run --limit N``: a quick
    #: look); reading stops there (pipeline/readers/limit.py). None: all of it
    limit: int | None = Field(None, gt=0)


#: a model class (``type`` is a field of :class:`StageSpec`: not usable in an annotation there)
ModelType = type[BaseModel]


def _unknown_stage(name: str) -> str:
    """The problem of a stage type nobody registered, with the closest known one when a typo is likely."""
    known = known_stages()  # the built-ins and the installed entry points
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown stage {name!r} ({hint}known: {', '.join(known)}; or a module:Class of your own)"


def _find_stage(name: str) -> StageClass | Problem:
    """The class of stage type ``name`` (:func:`pipeline.stages.stage_class`), or the :class:`Problem` at
    ``type`` saying why there is none."""
    try:
        return stage_class(name)
    except KeyError:
        return Problem(("type",), _unknown_stage(name), "unknown_stage")
    except StageLookupError as exc:
        return Problem(("type",), str(exc), exc.kind)


class StageSpec(Strict):
    type: str
    params: dict[str, Any] = Field(default_factory=dict)

    _params: BaseModel | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _check_params(self) -> StageSpec:
        """``params`` against the stage's own ``Params`` model, each error at its field below ``params``."""
        cls = _find_stage(self.type)
        if isinstance(cls, Problem):
            raise validation_error(type(self).__name__, [cls], self.type)
        try:
            self._params = cls.Params.model_validate(self.params)
        except ValidationError as exc:
            problems = problems_of(exc, cls.Params)  # an unknown param names the closest known one
            raise validation_error(type(self).__name__, [p.under("params") for p in problems],
                                   self.params) from None
        return self

    @classmethod
    def field_model(cls, name: str, data: dict[str, Any]) -> ModelType | None:
        """The model that types field ``name`` of the stage entry ``data``: ``params`` is its stage's ``Params``
        (how :mod:`pipeline.secret_fields` finds a stage's secrets in a spec's JSON); None for another field or
        an unknown stage."""
        stage_type = data.get("type")
        if name != "params" or not isinstance(stage_type, str):
            return None
        found = _find_stage(stage_type)
        return None if isinstance(found, Problem) else found.Params

    @property
    def validated(self) -> BaseModel:
        """``params`` as the stage's ``Params`` (validated with the spec)."""
        assert self._params is not None, "a StageSpec is validated when it is made"
        return self._params

    @classmethod
    def __get_pydantic_json_schema__(cls, core: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        """``type``: a built-in or installed stage, or a ``module:Class`` (what :meth:`_check_params` accepts), in
        the JSON schema too."""
        schema = handler.resolve_ref_schema(handler(core))
        schema["properties"]["type"]["anyOf"] = [{"enum": known_stages()}, {"pattern": REFERENCE.pattern}]
        return schema


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


def _one_of(schema: dict[str, Any], *fields: tuple[str, str]) -> None:
    """A model validator's "exactly one of these fields" in the JSON schema."""
    schema["oneOf"] = [given(name, kind) for name, kind in fields]


class ValidationSpec(Strict):
    """``output.validation``: documents held out of training as a shard set of their own (``OUT/validation/``),
    chosen after curation by a hash of a key per document (pipeline/output/validation.py): exactly one of
    ``share`` (of the curated documents, at least one) or ``documents`` (at least that many)."""

    model_config = ConfigDict(json_schema_extra=lambda schema: _one_of(schema, ("share", "number"),
                                                                       ("documents", "integer")))

    share: float | None = Field(None, gt=0.0, lt=1.0)
    documents: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _one_of(self) -> ValidationSpec:
        if (self.share is None) == (self.documents is None):
            raise ValueError("give exactly one of share or documents")
        return self


class OutputSpec(Strict):
    path: str
    samples_per_shard: int = Field(1024, gt=0)
    write_rejected: bool = True
    #: the share of the documents a stage drops that ``rejected/`` keeps, chosen by document id (the same ones on
    #: every run, at any parallelism): at terabyte scale every drop's full text is a second corpus. Counts in
    #: stats.json stay exact, and what the reader sets aside (malformed input) is always written whole.
    rejected_sample: float = Field(1.0, gt=0.0, le=1.0)
    overwrite: bool = False
    #: also write the kept documents (text, metadata, annotations) in ``ord`` order under ``documents/``
    documents: Literal["parquet", "jsonl"] | None = None
    #: a ``meta`` field (``lang`` after the ``lid`` stage): one shard set per value, in ``OUT/<value>/``
    #: (manifest, tokenizer, shards), sharing one tokenizer; see pipeline/output/groups.py
    split_by: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
    #: earlier outputs the dataset card compares this one with, oldest first (a schedule sets its versions);
    #: the card only, so it is not part of the spec's hash (pipeline/card)
    card_compare: list[str] = Field(default_factory=list, max_length=1000)
    #: a validation split: ``{share: 0.005}`` or ``{documents: N}``; None: none (and not in the spec's hash)
    validation: ValidationSpec | None = None


class ExecutionSpec(Strict):
    address: str | None = Field(None, description="Ray address; None starts a local Ray")
    parallelism: int | None = Field(None, ge=1, description="workers per stage; None = CPUs")
    num_cpus: int | None = Field(None, ge=1, description="CPUs for a local Ray")
    batch_size: int = Field(256, ge=1)
    seed: int = 0


def _documents_rule(schema: dict[str, Any]) -> None:
    """Rules of :meth:`JobSpec._check_across_stages` in the JSON schema: a tokenizer (or none given: the default
    one), or ``output.documents``; and ``output.validation`` only with a tokenizer and without ``split_by``."""
    no_validation = {"properties": {"output": {"properties": {"validation": {"type": "null"}}}}}
    validation_fits = {"properties": {"tokenizer": {"type": "object"},
                                      "output": {"properties": {"split_by": {"type": "null"}}}}}
    schema["allOf"] = [
        {"anyOf": [{"properties": {"tokenizer": {"type": "object"}}},
                   {"properties": {"output": {"required": ["documents"],
                                              "properties": {"documents": {"type": "string"}}}}}]},
        {"anyOf": [no_validation, validation_fits]}]


class JobSpec(Strict):
    model_config = ConfigDict(json_schema_extra=_documents_rule)

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
        found += self._validation_problems()
        if found:
            raise validation_error(type(self).__name__, found)
        return self

    def _validation_problems(self) -> list[Problem]:
        """``output.validation`` is a shard set of the output's own: it needs a tokenizer and one training set."""
        if self.output.validation is None:
            return []
        if self.tokenizer is None:
            return [Problem(("output", "validation"), "needs a tokenizer (the split is a shard set); "
                            "a documents-only job has none", "validation_needs_tokenizer")]
        if self.output.split_by:
            return [Problem(("output", "validation"), "cannot be combined with output.split_by (one validation "
                            "split for one training shard set)", "validation_with_split_by")]
        return []

    def stage_params(self, index: int) -> BaseModel:
        """The validated ``Params`` of stage ``index`` (parsed once, when the spec was)."""
        return self.stages[index].validated

    def content_hash(self) -> str:
        """Hash of what determines the output bytes: execution settings are left out."""
        data = self.model_dump(mode="json",
                               exclude={"execution": True, "output": {"overwrite", "path", "card_compare"}})
        data["execution"] = {"seed": self.execution.seed}
        if self.output.rejected_sample == 1.0:  # a field added later: its default keeps earlier outputs' hashes
            del data["output"]["rejected_sample"]
        if self.output.validation is None:  # the same for output.validation
            del data["output"]["validation"]
        for item in data["inputs"]:  # the same for inputs[].max_record_bytes and inputs[].limit
            if item["max_record_bytes"] == DEFAULT_MAX_RECORD_BYTES:
                del item["max_record_bytes"]
            if item["limit"] is None:
                del item["limit"]
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def parse_spec(data: Any) -> JobSpec:
    """Validate a spec given as a dict (schema only; :func:`pipeline.preflight.check_spec` checks files)."""
    return parse_model(JobSpec, data)


def load_spec(path: str | Path) -> JobSpec:
    """Load a spec from a YAML or JSON file; its paths resolve against its folder (:func:`resolve_paths`).

    A file that cannot be read or parsed is one problem naming it, with the line and column for a syntax error
    (``spec.yaml:4:7: mapping values are not allowed here``); a schema problem of a YAML file names the line of
    its field (``stages.1.type (line 5): ...``)."""
    path = Path(path)
    data, lines = read_spec_file(path)
    try:
        return parse_spec(data)
    except SpecError as exc:
        raise SpecError(with_lines(exc.problems, lines)) from None


#: a YAML spec's field paths -> their 1-based line (of the value; of the key for a missing field's parent)
Lines = dict[Loc, int]


def read_spec_file(path: Path) -> tuple[Any, Lines]:
    """The data of the spec file at ``path``, its paths resolved (:func:`resolve_paths`), and each field's line.

    :class:`SpecError` (kind :data:`~pipeline.problems.SPEC_FILE`) when it cannot be read or parsed."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else f"not UTF-8 text ({exc.reason})"
        raise SpecError.one((), f"{path}: cannot read: {why}", SPEC_FILE) from None
    lines: Lines = {}
    try:
        if path.suffix == ".json":
            check_json(text)
            data = json.loads(text)
        else:
            loader = Loader(text)
            try:
                node = loader.get_single_node()
                data = loader.construct_document(node) if node is not None else None
            finally:
                loader.dispose()
            if node is not None:
                _node_lines(node, (), lines)
    except json.JSONDecodeError as exc:
        raise SpecError.one((), f"{path}:{exc.lineno}:{exc.colno}: {exc.msg}", SPEC_FILE) from None
    except TooDeep as exc:
        raise SpecError.one((), exc.at(path), SPEC_FILE) from None
    except yaml.YAMLError as exc:
        raise SpecError.one((), _yaml_error(path, exc), SPEC_FILE) from None
    if isinstance(data, dict):
        stages = data.get("stages")
        for stage in stages if isinstance(stages, list) else []:
            if isinstance(stage, dict) and isinstance(stage.get("type"), str):
                next_to_spec(stage["type"], path.resolve().parent)  # a module:Class stage may sit next to the spec
        resolve_paths(data, path.resolve().parent)
    return data, lines


def _yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    """``path:LINE:COL: problem`` (1-based, where the parser stopped), else the first line of yaml's message."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    if isinstance(exc, yaml.MarkedYAMLError) and mark is not None and problem:
        return f"{path}:{mark.line + 1}:{mark.column + 1}: {problem}"
    return f"{path} is not valid YAML: {str(exc).splitlines()[0]}"


def _node_lines(node: yaml.Node, loc: Loc, lines: Lines) -> None:
    """Fill ``lines`` with the line of every field below ``node`` (a composed YAML document)."""
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                _node_lines(value, (*loc, key.value), lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _node_lines(item, (*loc, i), lines)


def with_lines(problems: list[Problem], lines: Lines) -> list[Problem]:
    """``problems`` with the YAML line of their field, or of its nearest parent that the file has (a missing
    field: the mapping it is missing from); unchanged for a JSON file or a problem of the spec as a whole."""
    if not lines:
        return problems
    out = []
    for p in problems:
        loc = p.loc
        while loc and loc not in lines:
            loc = loc[:-1]
        out.append(p.at_line(lines[loc]) if loc else p)
    return out


def resolve_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Make every path field of a spec's ``data`` absolute, in place: ``inputs[].path``, ``tokenizer.path``,
    ``output.path``, ``output.card_compare`` and each stage's path params (``Stage.path_params``:
    ``dedup_against``, ``benchmarks``, ``model``...), relative ones against ``base`` (:func:`_under`).
    ``tokenmill run`` and ``tokenmill submit`` both load a spec file through this, so the server gets the paths
    ``run`` would use. Anything malformed is left alone for validation to report."""
    inputs = data.get("inputs")
    for inp in inputs if isinstance(inputs, list) else []:
        if isinstance(inp, dict) and isinstance(inp.get("path"), str):
            inp["path"] = _under(base, inp["path"])
    for key in ("tokenizer", "output"):
        part = data.get(key)
        if isinstance(part, dict) and isinstance(part.get("path"), str):
            part["path"] = _under(base, part["path"])
    out = data.get("output")
    if isinstance(out, dict) and isinstance(out.get("card_compare"), list):
        out["card_compare"] = [_under(base, p) if isinstance(p, str) else p for p in out["card_compare"]]
    _resolve_stage_paths(data.get("stages"), base)
    return data


def _under(base: Path, path: str) -> str:
    """``path`` as written in a spec file: ``~`` is the user's home, a relative path is below the
    spec's folder, an absolute one stays, and ``..`` is resolved (:func:`_without_dotdot`); a URI
    (``s3://bucket/key``) stays as it is, ``file://`` is dropped."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", path) and not path.startswith("file://"):
        return path
    return _without_dotdot(os.path.join(base, os.path.expanduser(path.removeprefix("file://"))))


def _without_dotdot(path: str) -> str:
    """An absolute ``path`` with no ``.``, ``..`` or doubled ``/`` left (the server refuses ``..``).

    ``..`` means what the OS makes of it: the part up to the last ``..`` is resolved with symlinks followed
    (``link/..`` is the parent of the link's target, not ``.``); what follows, a glob included, stays as
    written. A path without ``..`` is only tidied (``os.path.normpath``), its symlinks kept."""
    parts = Path(path).parts
    if ".." not in parts:
        return os.path.normpath(path)
    last = len(parts) - 1 - parts[::-1].index("..")
    try:
        head = os.path.realpath(os.path.join(*parts[: last + 1]))
    except (OSError, ValueError):  # a NUL byte: left for the checks to name
        head = os.path.normpath(os.path.join(*parts[: last + 1]))
    return os.path.normpath(os.path.join(head, *parts[last + 1:]))


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
        cls = _find_stage(stage["type"])
        if isinstance(cls, Problem) or not isinstance(params, dict):
            continue
        for key in cls.path_params:
            if key in params:
                params[key] = resolve(params[key])
