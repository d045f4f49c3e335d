"""Process group, FSDP2 sharding with bf16 mixed precision, and the DeepSpeed ZeRO alternative.

Under ``torchrun`` the usual environment (RANK, WORLD_SIZE, LOCAL_RANK...) sets up NCCL on CUDA and
gloo on CPU; run directly, a one-process group is made in memory so the same code path applies.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn as nn

if TYPE_CHECKING:
    from training.model import Llama


@dataclass
class DistInfo:
    rank: int
    world: int
    local_rank: int
    device: torch.device


def init_distributed() -> DistInfo:
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    if not dist.is_initialized():
        if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, device_id=device if cuda else None)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device)


def fsdp_bf16_works(device: torch.device) -> tuple[bool, str]:
    """FSDP2 bf16 mixed precision on gloo/CPU depends on the torch build: try it on a tiny module
    (every rank runs the same probe, so they all agree)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # ~0.6 s to import: only to shard

    try:
        probe = nn.Linear(8, 8, bias=False).to(device)
        fully_shard(probe, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                           reduce_dtype=torch.float32))
        probe(torch.ones(2, 8, device=device)).float().sum().backward()
        ok = probe.weight.grad is not None and probe.weight.grad.dtype == torch.float32
        return ok, "" if ok else "gradients did not come back in fp32"
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        return False, str(exc).splitlines()[0]


def apply_fsdp(model: Llama, precision: str, reshard_after_forward: bool = True) -> Llama:
    """``fully_shard`` each transformer block, then the root (embeddings, final norm, head)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # ~0.6 s to import: only to shard

    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if precision == "bf16" else MixedPrecisionPolicy())
    for block in model.blocks():
        fully_shard(block, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return model


def apply_deepspeed(model: nn.Module, optimizer: torch.optim.Optimizer, config_path: str | None,
                    micro_batch: int, grad_clip: float, precision: str, device: torch.device,
                    grad_accum: int = 1) -> Any:
    """Wrap model and our AdamW in a DeepSpeed engine; the JSON supplies ZeRO settings, the
    trainer's own values override batch size, clipping and precision so the two cannot disagree."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # optional extra; reads DS_ACCELERATOR when imported, so after it is set

    conf: dict[str, Any] = {"zero_optimization": {"stage": 2}}
    if config_path:
        try:
            conf = json.loads(Path(config_path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"parallel.deepspeed_config: cannot read {config_path}: {exc}") from None
    conf["train_micro_batch_size_per_gpu"] = micro_batch
    conf["gradient_accumulation_steps"] = grad_accum
    conf.pop("train_batch_size", None)
    conf["gradient_clipping"] = grad_clip
    conf["bf16"] = {"enabled": precision == "bf16"}
    conf.pop("fp16", None)
    conf.setdefault("steps_per_print", 10**9)
    if device.type == "cpu":
        # DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce (deepspeed_shm_comm) when it starts: about
        # a minute on 2 cores on every fresh machine, for a kernel only its inference all-reduce (AutoTP) calls;
        # training reduces through the gloo group. Marked incompatible, the backend skips it (the ops module keeps
        # this dict for the process, for such edits).
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")  # reuses our group
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=conf)
    return engine


def say(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"tokenmill train: {msg}", file=sys.stderr, flush=True)
