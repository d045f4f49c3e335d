"""The plan of an ablation: each variant's job spec, the proxy runs (variants x seeds) and their step budget.

Every variant reads the same raw documents (the common validation set taken out), gets the same tokenizer and
trains for the same number of tokens: ``max_steps = ceil(budget.tokens / (batch_size x grad_accum x seq_len x
nproc))``, so the variants differ in their data only.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.overrides import Override, apply_override
from pipeline.problems import Problem, SpecError
from pipeline.spec import JobSpec, OutputSpec, parse_spec
from service.ablation.spec import AblationSpec

#: the trainer's defaults for the fields the budget needs (training/config.py: DataConfig, OptimConfig), used
#: when the proxy config leaves them out
TRAINER_DEFAULTS = {"data.batch_size": 8, "optim.grad_accum": 1}
#: each variant's own validation split when the base's output does not say (``output.validation``, taken after
#: dedup; ``validation: null`` there: none)
OWN_VALIDATION = {"share": 0.02}


@dataclass(frozen=True)
class Run:
    """One proxy model: a variant trained with a seed."""

    variant: str
    seed: int


@dataclass(frozen=True)
class Layout:
    """Where everything of an ablation lives under its ``out`` folder."""

    out: Path

    @property
    def raw(self) -> Path:  # what the variants read: the raw input less the common validation set
        return self.out / "raw" / "train.jsonl"

    @property
    def common(self) -> Path:
        return self.out / "common_validation.jsonl"

    def common_part(self, value: str) -> Path:
        return self.out / "common_validation" / f"{value}.jsonl"

    @property
    def tokenizer(self) -> Path:
        return self.out / "tokenizer.json"

    def data(self, variant: str) -> Path:
        return self.out / "variants" / variant / "data"

    def run(self, run: Run) -> Path:
        return self.out / "variants" / run.variant / f"seed-{run.seed}"

    def eval_json(self, run: Run) -> Path:
        return self.run(run) / "eval.json"

    @property
    def steps(self) -> Path:
        return self.out / "steps.jsonl"


@dataclass(frozen=True)
class Plan:
    spec: AblationSpec
    layout: Layout
    jobs: dict[str, JobSpec]
    runs: list[Run]
    seq_len: int
    tokens_per_step: int
    max_steps: int

    @property
    def tokenizer_path(self) -> Path:
        return Path(self.spec.tokenizer.path) if self.spec.tokenizer.path else self.layout.tokenizer


def make_plan(spec: AblationSpec) -> Plan:
    """The plan, every variant's job spec validated (a problem at ``variants.NAME...`` or ``base...``)."""
    layout = Layout(Path(spec.out))
    tok = Path(spec.tokenizer.path) if spec.tokenizer.path else layout.tokenizer
    jobs: dict[str, JobSpec] = {}
    problems: list[Problem] = []
    for name, variant in spec.variants.items():
        try:
            jobs[name] = parse_spec(variant_job(spec, name, layout, tok))
        except SpecError as exc:
            problems += [_where(p, name, variant.stages is not None, variant.set or {}) for p in exc.problems]
    if problems:
        raise SpecError(problems)
    seq_lens = {name: job.packing.seq_len for name, job in jobs.items()}
    if len(set(seq_lens.values())) > 1:
        raise SpecError.one(("variants",), f"packing.seq_len differs between variants ({seq_lens}): one token "
                            "budget needs one sequence length")
    seq_len = next(iter(seq_lens.values()))
    per_step = proxy_batch(spec) * seq_len * spec.proxy.nproc
    runs = [Run(name, seed) for name in spec.variants for seed in spec.seeds]
    return Plan(spec, layout, jobs, runs, seq_len, per_step, max(1, math.ceil(spec.budget.tokens / per_step)))


def variant_job(spec: AblationSpec, name: str, layout: Layout, tokenizer: Path) -> dict[str, Any]:
    """The job spec data of variant ``name``: the base, its stages or overrides, then what ablate decides (the
    input, the shared tokenizer, the output folder)."""
    data = copy.deepcopy(spec.base)
    variant = spec.variants[name]
    if variant.stages is not None:
        data["stages"] = copy.deepcopy(variant.stages)
    for key, value in (variant.set or {}).items():
        apply_override(data, Override(f"{key}={value}", tuple(str(key).split(".")), copy.deepcopy(value)))
    data["name"] = f"{spec.name}-{name}"
    data["inputs"] = [{"path": str(layout.raw), "format": "jsonl"}]
    tok = {k: v for k, v in (data.get("tokenizer") or {}).items() if k != "train"}
    data["tokenizer"] = {**tok, "path": str(tokenizer)}
    output = dict(data.get("output") or {})
    output["path"] = str(layout.data(name))
    if "validation" in OutputSpec.model_fields and "validation" not in output:  # null: none
        output["validation"] = dict(OWN_VALIDATION)
    data["output"] = output
    return data


def _where(p: Problem, name: str, own_stages: bool, sets: dict[str, Any]) -> Problem:
    """A problem of variant ``name``'s job spec at the ablation file's field that gave it."""
    field = ".".join(str(x) for x in p.loc)
    given = next((k for k in sets if field == k or field.startswith(f"{k}.")), None)
    if given is not None:
        return Problem(("variants", name, "set", given), p.msg, p.kind)
    if own_stages and p.loc[:1] == ("stages",):
        return p.under("variants", name)
    return Problem(("base", *p.loc), f"{p.msg} (in variant {name})", p.kind)


def proxy_config(spec: AblationSpec) -> dict[str, Any]:
    """The proxy's trainer config file as data (its ``--set`` overrides not applied)."""
    try:
        data = yaml.safe_load(Path(spec.proxy.config).read_text()) or {}
    except OSError as exc:
        raise SpecError.one(("proxy", "config"), f"cannot read {spec.proxy.config}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SpecError.one(("proxy", "config"), f"{spec.proxy.config} does not parse: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError.one(("proxy", "config"), f"{spec.proxy.config} must hold a mapping")
    return data


def proxy_batch(spec: AblationSpec) -> int:
    """Sequences per optimizer step and process: ``data.batch_size x optim.grad_accum`` of the proxy config after
    its overrides (the trainer's defaults where it sets neither)."""
    config = proxy_config(spec)
    product = 1
    for key, default in TRAINER_DEFAULTS.items():
        section, field = key.split(".")
        value = spec.proxy.set.get(key, (config.get(section) or {}).get(field, default))
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecError.one(("proxy", "set", key) if key in spec.proxy.set else ("proxy", "config"),
                                f"{key}: {value!r} is not a positive whole number")
        product *= value
    return product
