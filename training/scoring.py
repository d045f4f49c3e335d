"""Scoring a model on collated batches with the trainer's own loss: the validation pass and ``tokenmill eval``.

:func:`batch_inputs` and the loss (``token_loss_sum`` over labels the loader already masked at document ends,
``loss_mask`` zeros and padding) are what the trainer's ``train_step`` runs, so a validation loss is the training
loss on other tokens, not a second definition of it. :func:`model_from_checkpoint` rebuilds a trainer checkpoint
as one CPU model in one process, whatever world size wrote it (DCP re-shards on load).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from kernels.attention import DocMask
from pipeline.shard_format import TOKENIZER
from training.checkpoint import TRAINER, CheckpointError
from training.data import IGNORE_INDEX
from training.model import Llama, ModelConfig, token_loss_sum

#: what a collated batch becomes on the device: input ids, positions, labels, the document mask
ModelInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, DocMask]


def batch_inputs(batch: dict[str, Any], device: torch.device) -> ModelInputs:
    """A loader batch (``training.data.collate``) on ``device``: what the model and the loss take."""
    ids = batch["input_ids"].to(device, non_blocking=True)
    pos = batch["position_ids"].to(device, non_blocking=True)
    labels = batch["labels"].to(device, non_blocking=True)
    mask = DocMask(batch["cu_seqlens"].to(device, non_blocking=True), int(batch["max_seqlen"]),
                   batch["seq_ids"].to(device, non_blocking=True))
    return ids, pos, labels, mask


def _device_of(model: torch.nn.Module) -> torch.device:
    param = next(model.parameters())
    local = getattr(param, "to_local", None)  # an FSDP2 DTensor: the device of this rank's shard
    return (local() if local is not None else param).device


@torch.no_grad()
def token_nll(model: torch.nn.Module, batch: dict[str, Any],
              token_bytes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(summed next-token NLL in nats as float64, the count of target tokens, their UTF-8 bytes) over one
    collated batch, without gradients, the model in eval mode for the call. ``token_bytes``: bytes per token
    id (:func:`training.token_bytes.token_byte_lengths` as a tensor); None counts 0 bytes. A target is a label
    the trainer's loss counts: the next token within its document where ``loss_mask`` is 1, never padding."""
    device = _device_of(model)
    ids, pos, labels, mask = batch_inputs(batch, device)
    was_training = model.training
    model.eval()
    try:
        nll = token_loss_sum(model(ids, pos, mask), labels).to(torch.float64)
    finally:
        model.train(was_training)
    targets = labels[labels != IGNORE_INDEX].long()
    count = torch.tensor(targets.numel(), dtype=torch.float64, device=device)
    if token_bytes is None:
        return nll, count, torch.zeros((), dtype=torch.float64, device=device)
    nbytes = token_bytes.to(device)[targets].sum().to(torch.float64)
    return nll, count, nbytes


def _trainer_state(path: Path) -> dict[str, Any]:
    try:
        state = json.loads((path / TRAINER).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not a complete checkpoint (no {TRAINER})") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read {TRAINER}: {exc}") from None
    if state.get("strategy") == "deepspeed":
        raise CheckpointError(f"{path}: a DeepSpeed checkpoint: loading one for evaluation is not supported "
                              "(train with parallel.strategy fsdp)")
    if not isinstance(state.get("model"), dict):
        raise CheckpointError(f"{path}: {TRAINER} names no model config")
    return state


def run_tokenizer(ckpt_dir: Path) -> str | None:
    """The tokenizer of the data the run trained on: ``tokenizer.json`` of the shard set that the run's
    ``config.json`` (beside ``checkpoints/``) names as ``data.path``; None when it cannot be found there."""
    config = ckpt_dir.parent.parent / "config.json"
    try:
        data_path = json.loads(config.read_text()).get("data", {}).get("path")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(data_path, str) or "://" in data_path:
        return None
    candidate = Path(data_path) / TOKENIZER
    return str(candidate) if candidate.is_file() else None


def model_from_checkpoint(ckpt_dir: str | Path) -> tuple[Llama, ModelConfig, str | None]:
    """(model in eval mode on CPU, its config, the run's tokenizer path or None) of a trainer checkpoint
    folder (``<out>/checkpoints/step-N``), loaded in this process without a process group. Checkpoints are
    trusted input (DCP metadata is a pickle): see :mod:`training.checkpoint`."""
    path = Path(ckpt_dir)
    state = _trainer_state(path)
    try:
        cfg = ModelConfig.from_dict(state["model"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: model config: {exc}") from None
    model = Llama(cfg, "sdpa")
    weights = {"model": model.state_dict()}
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(weights, checkpoint_id=str(path), no_dist=True)
    except Exception as exc:  # a damaged or foreign checkpoint: name it rather than dump a traceback
        raise CheckpointError(f"{path}: cannot load the model weights: {type(exc).__name__}: {exc}") from None
    model.load_state_dict(weights["model"])
    return model.eval(), cfg, run_tokenizer(path)
