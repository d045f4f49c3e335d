"""The job spec: one pydantic model for the CLI and the REST API, loaded from YAML or JSON.

An invalid spec is refused before any work starts, with the field path and the reason
(:class:`SpecError`). Stage parameters are validated against each stage's own ``Params`` model.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

InputFormat = Literal["auto", "jsonl", "parquet", "text", "warc", "instruction", "chat"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputSpec(Strict):
    path: str = Field(description="a file, a folder, or a glob")
    format: InputFormat = "auto"
    text_field: str = "text"
    id_field: str = "id"
    #: for format=instruction/chat: the template that renders a record (see pipeline.sft)
    template: str | None = None


class StageSpec(Strict):
    type: str
    params: dict[str, Any] = Field(default_factory=dict)


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


class OutputSpec(Strict):
    path: str
    samples_per_shard: int = Field(1024, gt=0)
    write_rejected: bool = True
    overwrite: bool = False


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
    tokenizer: TokenizerSpec = Field(default_factory=TokenizerSpec)
    packing: PackingSpec = Field(default_factory=PackingSpec)
    output: OutputSpec
    execution: ExecutionSpec = Field(default_factory=ExecutionSpec)

    @model_validator(mode="after")
    def _check_stages(self) -> JobSpec:
        from pipeline.stages import STAGES

        errors = []
        for i, stage in enumerate(self.stages):
            cls = STAGES.get(stage.type)
            if cls is None:
                errors.append(
                    f"stages.{i}.type: unknown stage {stage.type!r} (known: {', '.join(sorted(STAGES))})"
                )
                continue
            try:
                cls.Params.model_validate(stage.params)
            except ValidationError as exc:
                for err in exc.errors():
                    loc = ".".join(str(p) for p in err["loc"])
                    errors.append(f"stages.{i}.params.{loc}: {err['msg']}")
        if errors:
            raise ValueError("; ".join(errors))
        return self

    def stage_params(self, index: int) -> BaseModel:
        from pipeline.stages import STAGES

        stage = self.stages[index]
        return STAGES[stage.type].Params.model_validate(stage.params)

    def content_hash(self) -> str:
        """Hash of what determines the output bytes: execution settings are left out."""
        data = self.model_dump(mode="json", exclude={"execution": True, "output": {"overwrite", "path"}})
        data["execution"] = {"seed": self.execution.seed}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


class SpecError(ValueError):
    """A spec that cannot run: ``str()`` is one line per problem, each naming the field path."""


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "spec"
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
            # our own validators already name their fields
            lines.extend(part.strip() for part in msg.split("; "))
            continue
        lines.append(f"{loc}: {msg}")
    return "\n".join(lines)


def parse_spec(data: Any, check_inputs: bool = True) -> JobSpec:
    """Validate a spec given as a dict; with ``check_inputs`` every input must match a file."""
    if not isinstance(data, dict):
        raise SpecError("spec: must be a mapping")
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(exc)) from None
    if check_inputs:
        from pipeline.readers import expand_inputs

        missing = [
            f"inputs.{i}.path: no file matches {inp.path!r}"
            for i, inp in enumerate(spec.inputs)
            if not expand_inputs([inp])
        ]
        missing.extend(_preflight_stages(spec))
        if spec.tokenizer.path and not Path(spec.tokenizer.path).is_file():
            missing.append(f"tokenizer.path: no such file {spec.tokenizer.path!r}")
        if missing:
            raise SpecError("\n".join(missing))
    return spec


def _preflight_stages(spec: JobSpec) -> list[str]:
    from pipeline.stages import STAGES, StageContext

    problems = []
    for i, stage in enumerate(spec.stages):
        cls = STAGES[stage.type]
        try:
            cls(spec.stage_params(i), StageContext(spec.name, spec.output.path, i + 1, "")).preflight()
        except ValueError as exc:
            problems.append(f"stages.{i}.params.{exc}")
    return problems


def load_spec(path: str | Path, check_inputs: bool = True) -> JobSpec:
    """Load a spec from a YAML or JSON file; relative paths (inputs, tokenizer, output, stage path
    params such as ``dedup_against``) resolve against its folder."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"spec: cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError(f"spec: {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                        f"{str(exc).splitlines()[0]}") from None
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
    return parse_spec(data, check_inputs=check_inputs)


def _under(base: Path, path: str) -> str:
    """``path`` as written in a spec file: ``~`` is the user's home, a relative path is below the
    spec's folder, an absolute one stays as it is."""
    return str(base / os.path.expanduser(path))


def _resolve_stage_paths(stages: Any, base: Path) -> None:
    """Resolve each stage's path params (``Stage.path_params``, e.g. ``dedup_against``) against ``base``.

    Absolute paths stay as they are (``base / "/abs"`` is ``/abs``); an empty string keeps meaning "none".
    Anything malformed is left alone for validation to report.
    """
    from pipeline.stages import STAGES

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
        cls = STAGES.get(stage["type"])
        if cls is None or not isinstance(params, dict):
            continue
        for key in cls.path_params:
            if key in params:
                params[key] = resolve(params[key])
