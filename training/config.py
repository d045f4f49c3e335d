"""Training configuration: one pydantic model, loaded from YAML/JSON with ``--set a.b=value`` overrides.

Model sizes are given as a preset (``tiny``, ``125m``, ``350m``...) plus any field to override;
the vocabulary and sequence length always come from the shard set's manifest, so a config cannot
disagree with the data it trains on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ConfigError(ValueError):
    """A training config that cannot run; ``str()`` names the field and the reason."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataConfig(Strict):
    path: str | None = Field(None, description="shard set (a directory or an http(s) base URL) or a mixture "
                              "file (mixture.json, a path or URL)")
    batch_size: int = Field(8, ge=1, description="sequences per rank per step")
    num_workers: int = Field(2, ge=0)
    shuffle: bool = True
    shuffle_window: int = Field(4096, ge=1)
    remainder: Literal["drop", "wrap"] = "drop"
    seed: int = Field(0, ge=0)
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP headers, e.g. an API key")


class ModelSection(Strict):
    preset: str | None = "small"
    overrides: dict[str, Any] = Field(default_factory=dict)


class OptimConfig(Strict):
    lr: float = Field(3e-4, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup_steps: int = Field(100, ge=0)
    max_steps: int = Field(1000, ge=1)
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = Field(1.0, ge=0, description="0 disables clipping")
    grad_accum: int = Field(1, ge=1, description="micro-batches of data.batch_size per optimizer step")


class ParallelConfig(Strict):
    strategy: Literal["fsdp", "deepspeed"] = "fsdp"
    precision: Literal["bf16", "fp32"] = "bf16"
    deepspeed_config: str | None = Field(None, description="DeepSpeed JSON (ZeRO stage etc.)")
    attention: str = "auto"
    compile: bool = False
    compile_attention: bool = Field(True, description="with compile: trace attention into each block's "
                                    "graph; false compiles only the dense parts (for a torch whose "
                                    "attention op does not trace)")
    reshard_after_forward: bool = True
    defer_grad_sync: bool = Field(False, description="with optim.grad_accum > 1 under FSDP2: reduce "
                                  "gradients once per step instead of per micro-batch (less traffic, "
                                  "unsharded fp32 gradients held in between)")
    activation_checkpointing: bool = Field(False, description="recompute each block in backward: activation "
                                           "memory of one block instead of all, for ~1/3 more compute")
    gc_every: int = Field(50, ge=0, description="steps between Python garbage collections while training "
                          "(automatic GC off, so no rank pauses at a random step); 0: Python's automatic GC")


class LogConfig(Strict):
    every: int = Field(10, ge=1)
    tensorboard: bool = True
    peak_flops: float | None = Field(None, gt=0, description="per-device peak; None: known devices only")


class CheckpointConfig(Strict):
    every: int = Field(0, ge=0, description="steps between checkpoints; 0: only at the end")
    keep: int = Field(2, ge=1)
    at_end: bool = True


class EvalConfig(Strict):
    every: int = Field(0, ge=0, description="steps between validation passes (and one at the last step); 0: off")
    data: str | None = Field(None, description="validation shard set (a directory or an http(s) base URL); null: "
                             "<data.path>/validation when the data's manifest names a validation split")
    max_batches: int | None = Field(None, ge=1, description="score the first N batches of data.batch_size "
                                    "sequences, in the set's order; null: the whole set")


class TrainConfig(Strict):
    out_dir: str = "runs/train"
    seed: int = Field(0, ge=0)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelSection = Field(default_factory=ModelSection)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {k} is not a section")
    node[keys[-1]] = value


def _read_mapping(path: Path) -> dict[str, Any]:
    """The mapping a config file holds: JSON by its suffix, else YAML (an empty file is no setting)."""
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text) or {}
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config: {path} does not parse: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a mapping")
    return data


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML/JSON config (or start from defaults) and apply ``key.path=value`` overrides; a
    relative ``deepspeed_config`` resolves against the config file's folder."""
    data: dict[str, Any] = {}
    base: Path | None = None
    if path:
        path = Path(path)
        data = _read_mapping(path)
        base = path.resolve().parent
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key.path=value")
        _set_path(data, key.strip(), yaml.safe_load(raw))
    try:
        cfg = TrainConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("\n".join(lines)) from None
    ds = cfg.parallel.deepspeed_config
    if ds and base is not None and not Path(ds).is_absolute() and not Path(ds).exists():
        cfg.parallel.deepspeed_config = str(base / ds)
    return cfg
