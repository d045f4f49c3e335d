"""Checkpoints: model + optimizer through torch.distributed.checkpoint, loader and step as JSON.

Layout: ``<out>/checkpoints/step-00000120/`` holding the DCP files (each rank writes its own
shards), ``loader-rank<r>.json`` (each rank's loader position) and ``trainer.json`` (step, model
config). A checkpoint is written under ``.tmp`` and renamed once every rank has finished, so a
crash mid-save never leaves a checkpoint that looks complete. The DeepSpeed path stores the engine
with DeepSpeed's own ``save_checkpoint`` in the same folder layout.

Checkpoints are trusted input: DCP's ``.metadata`` and DeepSpeed's files are pickles that PyTorch
unpickles on load. Resume only from checkpoints your own runs wrote (``--resume auto`` looks only
in the run's ``out_dir``), never from a folder someone else handed you.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

TRAINER = "trainer.json"
_NAME = re.compile(r"^step-(\d{8})$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message says which and why."""


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    root = checkpoint_root(out_dir)
    if not root.is_dir():
        return None
    done = [p for p in root.iterdir() if _NAME.match(p.name) and (p / TRAINER).exists()]
    return max(done, key=lambda p: p.name) if done else None


def save(out_dir: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         loader_state: dict[str, Any], trainer_state: dict[str, Any], keep: int, engine: Any = None) -> Path:
    """Collective: every rank calls it. Returns the final checkpoint folder. ``engine``: a DeepSpeed
    engine (the DeepSpeed path), which saves model and optimizer itself."""
    rank = dist.get_rank()
    root = checkpoint_root(out_dir)
    final = root / f"step-{step:08d}"
    tmp = root / f"step-{step:08d}.tmp"
    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    dist.barrier()
    if engine is not None:
        engine.save_checkpoint(str(tmp), tag="engine")
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    (tmp / f"loader-rank{rank}.json").write_text(json.dumps(loader_state, indent=1) + "\n")
    dist.barrier()
    if rank == 0:
        (tmp / TRAINER).write_text(json.dumps({"step": step, **trainer_state}, indent=1) + "\n")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        old = sorted(p for p in root.iterdir() if _NAME.match(p.name))
        for p in old[:-keep]:
            shutil.rmtree(p, ignore_errors=True)
    dist.barrier()
    return final


def load(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         engine: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Collective: restore model/optimizer in place; returns (trainer state, this rank's loader state)."""
    path = Path(path)
    rank = dist.get_rank()
    trainer_file, loader_file = path / TRAINER, path / f"loader-rank{rank}.json"
    if not trainer_file.exists():
        raise CheckpointError(f"{path}: not a complete checkpoint (no {TRAINER})")
    if not loader_file.exists():
        raise CheckpointError(f"{path}: no loader state for rank {rank}: was it saved with another world size?")
    trainer = json.loads(trainer_file.read_text())
    if engine is not None:
        try:
            load_path, _ = engine.load_checkpoint(str(path), tag="engine")
        except Exception as exc:  # DeepSpeed raises whatever its loaders raise
            raise CheckpointError(f"{path}: DeepSpeed could not load the engine state: {exc}") from None
        if load_path is None:
            raise CheckpointError(f"{path}: DeepSpeed could not load the engine state")
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        try:
            dcp.load(state, checkpoint_id=str(path))
        except Exception as exc:  # a damaged or foreign checkpoint: name it rather than dump a traceback
            raise CheckpointError(f"{path}: cannot load model/optimizer state: {type(exc).__name__}: {exc}") from None
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return trainer, json.loads(loader_file.read_text())
