"""The ablation file (``tokenmill ablate ABLATION.yaml``): its model, read with each problem at its field.

``raw`` is one input as a job spec's ``inputs`` entry; ``base`` a job spec without inputs (ablate sets them, the
tokenizer and the output path); each variant replaces the base's stages or overrides its fields as ``tokenmill
run --set`` does. Relative paths resolve against the file's folder, as a job spec's do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from pipeline.problems import SpecError, parse_model
from pipeline.schema_rules import given
from pipeline.spec import InputSpec, read_spec_file, resolve_paths, with_lines

#: a variant's name is a folder name under ``OUT/variants/``
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _one_of(*fields: tuple[str, str]) -> ConfigDict:
    """A model validator's "exactly one of these fields" in the JSON schema too (``POST /v1/ablations``)."""
    def rule(schema: dict[str, Any]) -> None:
        schema["oneOf"] = [given(name, kind) for name, kind in fields]

    return ConfigDict(extra="forbid", json_schema_extra=rule)


class Variant(Strict):
    """One pipeline variant: ``stages`` replacing the base's, or ``set`` overrides (``key.path: value``)."""

    model_config = _one_of(("stages", "array"), ("set", "object"))

    stages: list[dict[str, Any]] | None = None
    set: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> Variant:
        if (self.stages is None) == (self.set is None):
            raise ValueError("give exactly one of stages (a list replacing the base's) or set (key.path: value)")
        return self


class SharedTokenizer(Strict):
    """One tokenizer for every variant, so that their losses compare: ``path``, or trained once on the raw input."""

    path: str | None = None
    vocab_size: int = Field(8192, ge=260, le=1 << 20)
    sample_docs: int = Field(20000, ge=1)
    min_frequency: int = Field(2, ge=1)


class Budget(Strict):
    tokens: int = Field(gt=0, description="training tokens per proxy run, the same for every variant")


class Proxy(Strict):
    """The proxy model: a trainer config (training/configs/proxy-cpu.yaml) and ``--set`` overrides of it."""

    config: str
    set: dict[str, Any] = Field(default_factory=dict)
    nproc: int = Field(1, ge=1, description="processes per run (torchrun --nproc_per_node)")
    launcher: Literal["auto", "python", "torchrun"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _a_path(cls, data: Any) -> Any:
        return {"config": data} if isinstance(data, str) else data


class CommonValidation(Strict):
    """The validation set every variant is scored on, held out from the raw input before any filter."""

    model_config = _one_of(("share", "number"), ("documents", "integer"))

    share: float | None = Field(None, gt=0.0, lt=1.0)
    documents: int | None = Field(None, ge=1)
    by: str | None = Field(None, description="a field of the raw records: bits per byte per value too")

    @model_validator(mode="after")
    def _one_of(self) -> CommonValidation:
        if (self.share is None) == (self.documents is None):
            raise ValueError("give exactly one of share (0 < share < 1) or documents (a count)")
        return self


class EvalOptions(Strict):
    limit: int | None = Field(None, ge=1, description="items per benchmark task (tokenmill eval --limit)")


class AblationSpec(Strict):
    name: str = Field("ablation", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    raw: InputSpec
    base: dict[str, Any] = Field(default_factory=dict, json_schema_extra={
        "not": {"anyOf": [{"required": ["inputs"]}, {"required": ["name"]}]}})
    #: a name that is not a folder name is refused by the schema too (patternProperties alone would let it by)
    variants: dict[Name, Variant] = Field(min_length=1, json_schema_extra={"additionalProperties": False})
    tokenizer: SharedTokenizer = Field(default_factory=SharedTokenizer)
    budget: Budget
    proxy: Proxy
    seeds: list[Annotated[int, Field(ge=0)]] = Field(default_factory=lambda: [0], min_length=1,
                                                     json_schema_extra={"uniqueItems": True})
    validation: CommonValidation = Field(default_factory=lambda: CommonValidation(share=0.02))
    tasks: list[str] = Field(default_factory=list)
    eval: EvalOptions = Field(default_factory=EvalOptions)
    out: str

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"{seeds} repeats a seed")
        return seeds

    @field_validator("base")
    @classmethod
    def _no_inputs(cls, base: dict[str, Any]) -> dict[str, Any]:
        given = [f for f in ("inputs", "name") if f in base]
        if given:
            raise ValueError(f"{', '.join(given)}: set by ablate (from raw and each variant's name); leave out")
        return base


def resolve(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The file's relative paths made absolute against ``folder``, in place: raw, base (as a job spec's),
    tokenizer.path, proxy.config, out and the path of each ``KIND:PATH`` task."""
    def under(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        fake = resolve_paths({"output": {"path": value}}, folder)
        return fake["output"]["path"]

    if isinstance(data.get("raw"), dict):
        data["raw"]["path"] = under(data["raw"].get("path"))
    if isinstance(data.get("base"), dict):
        resolve_paths(data["base"], folder)
    for key in ("tokenizer", "proxy"):
        part, field = data.get(key), "path" if key == "tokenizer" else "config"
        if isinstance(part, str) and key == "proxy":
            data[key] = part = {"config": part}
        if isinstance(part, dict) and isinstance(part.get(field), str):
            part[field] = under(part[field])
    if isinstance(data.get("out"), str):
        data["out"] = under(data["out"])
    if isinstance(data.get("tasks"), list):
        data["tasks"] = [_task_under(t, under) for t in data["tasks"]]
    return data


def _task_under(task: Any, under: Any) -> Any:
    kind, sep, path = task.partition(":") if isinstance(task, str) else ("", "", "")
    return f"{kind}:{under(path)}" if sep and path else task


def parse_ablation(data: Any) -> AblationSpec:
    """``data`` validated; :class:`SpecError` with one problem per field."""
    return parse_model(AblationSpec, data)


def load_ablation(path: str | Path) -> AblationSpec:
    """The ablation file at ``path`` (YAML or JSON), paths resolved, each problem with its YAML line."""
    path = Path(path)
    data, lines = read_spec_file(path)
    if isinstance(data, dict):
        resolve(data, path.resolve().parent)
    try:
        return parse_ablation(data)
    except SpecError as exc:
        raise SpecError(with_lines(exc.problems, lines)) from None
