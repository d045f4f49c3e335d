"""``tokenmill train`` / ``torchrun -m training.train``: train a small Llama on a tokenmill shard set.

One step: every rank takes one batch, the loss is summed over its valid tokens (``labels`` already
carry the SFT ``loss_mask`` and document boundaries) and divided by the *global* count of valid
tokens, so a token weighs the same whichever rank it landed on (FSDP/DeepSpeed average gradients
over ranks, hence the extra factor ``world``). AdamW with linear warmup and cosine decay, gradient
clipping; metrics every ``log.every`` steps; validation loss and bits per byte every ``eval.every`` steps and
at the last (:mod:`training.validate`); checkpoints with the loader's position, so a resumed run
repeats the uninterrupted one step for step.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from kernels.attention import select_backend
from kernels.extras import missing_extra_message
from pipeline.shard_format import Manifest
from training import checkpoint as ckpt
from training.config import ConfigError, ModelSection, OptimConfig, TrainConfig, load_config
from training.data import IGNORE_INDEX, LoaderError
from training.metrics import MetricsLogger, device_peak_flops, memory_stats
from training.mixture_data import open_loader
from training.model import PRESETS, Llama, ModelConfig, compiled_token_loss_sum, token_loss_sum
from training.parallel import DistInfo, apply_deepspeed, apply_fsdp, fsdp_bf16_works, init_distributed, say
from training.scoring import batch_inputs
from training.validate import Validator

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

VOCAB_MULTIPLE = 64  # pad the embedding so matmuls get tensor-core friendly shapes
STOP_CHECK_EVERY = 10  # steps between looks at the SIGTERM vote on GPU (each look syncs the device)
EXIT_TERMINATED = 143  # 128 + SIGTERM: checkpointed, not finished; a scheduler should rerun us

#: a step's gradient norm: FSDP2's a (D)Tensor, read only at log time (reading syncs the device); DeepSpeed's a float
GradNorm = float | torch.Tensor


def build_model_config(section: ModelSection, manifest: Manifest) -> ModelConfig:
    """Preset + overrides; vocabulary and sequence length come from the shard set."""
    if section.preset and section.preset not in PRESETS:
        raise ConfigError(f"model.preset: unknown {section.preset!r} (known: {', '.join(PRESETS)})")
    data: dict[str, Any] = dict(PRESETS[section.preset]) if section.preset else {}
    data.update(section.overrides)
    vocab = VOCAB_MULTIPLE * math.ceil(manifest.vocab_size / VOCAB_MULTIPLE)
    data["vocab_size"] = max(int(data.get("vocab_size") or 0), vocab)
    data["max_seq_len"] = max(int(data.get("max_seq_len") or 0), manifest.seq_len)
    try:
        return ModelConfig.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"model: {exc}") from None


def lr_at(step: int, opt: OptimConfig) -> float:
    """Learning rate for (1-based) ``step``: linear warmup, then cosine down to ``min_lr_ratio``."""
    if opt.warmup_steps and step <= opt.warmup_steps:
        return opt.lr * step / opt.warmup_steps
    span = max(1, opt.max_steps - opt.warmup_steps)
    progress = min(1.0, (step - opt.warmup_steps) / span)
    floor = opt.lr * opt.min_lr_ratio
    return floor + 0.5 * (opt.lr - floor) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, opt: OptimConfig) -> torch.optim.Optimizer:
    """AdamW; no weight decay on norms (1-D parameters)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # the fused kernel (one launch for all parameters) on CUDA; the default foreach path elsewhere
    fused = all(p.is_cuda for p in decay + no_decay) or None
    return torch.optim.AdamW(groups, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, fused=fused)


def _grad_norm(value: GradNorm | None) -> float:
    """A gradient norm as a float (DeepSpeed's is None before its first step)."""
    if value is None:
        return float("nan")
    if hasattr(value, "full_tensor"):
        value = value.full_tensor()
    return float(value)


@dataclass
class _Window:
    """The steps since the last metrics line: the loss sum (this rank's) and the loss tokens (all ranks')
    stay on the device until logged, as reading them syncs it; ``gnorm`` is the last step's."""

    loss: torch.Tensor
    valid: torch.Tensor
    tokens: int = 0  # this rank's non-padding tokens
    steps: int = 0
    gnorm: GradNorm = float("nan")

    @classmethod
    def on(cls, device: torch.device) -> _Window:
        return cls(torch.zeros((), dtype=torch.float64, device=device),
                   torch.zeros((), dtype=torch.float64, device=device))

    def add(self, loss_sum: torch.Tensor, valid: torch.Tensor, tokens: int, gnorm: GradNorm) -> None:
        self.loss += loss_sum
        self.valid += valid
        self.tokens += tokens
        self.steps += 1
        self.gnorm = gnorm

    def reset(self) -> None:
        self.loss.zero_()
        self.valid.zero_()
        self.tokens, self.steps = 0, 0


class Trainer:
    def __init__(self, cfg: TrainConfig, info: DistInfo) -> None:
        self.cfg, self.info = cfg, info
        self.out = Path(cfg.out_dir)
        d = cfg.data
        if not d.path:
            raise ConfigError("data.path: required (or pass --data)")
        self.loader = open_loader(
            d.path, d.batch_size, rank=info.rank, world=info.world, seed=d.seed, shuffle=d.shuffle,
            shuffle_window=d.shuffle_window, num_workers=d.num_workers, remainder=d.remainder,
            headers=d.headers, pin_memory=info.device.type == "cuda",
        )
        self.manifest = self.loader.manifest
        #: a mixture's sources, and the non-padding tokens of each that all ranks consumed (reduced every step)
        self.source_names: list[str] = list(getattr(self.loader, "source_names", []))
        self.source_tokens = torch.zeros(len(self.source_names), dtype=torch.float64, device=info.device)
        self.mcfg = build_model_config(cfg.model, self.manifest)
        self.backend = select_backend(info.device, cfg.parallel.attention)
        torch.manual_seed(cfg.seed)
        model = Llama(self.mcfg, self.backend).to(info.device)
        model.checkpoint_activations = cfg.parallel.activation_checkpointing
        self.precision = cfg.parallel.precision
        self.engine: Any = None  # a DeepSpeed engine (strategy deepspeed)
        self.loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = token_loss_sum
        if cfg.parallel.strategy == "fsdp":
            if self.precision == "bf16" and info.device.type == "cpu":
                ok, why = fsdp_bf16_works(info.device)
                if not ok:
                    say(info.rank, f"FSDP2 bf16 mixed precision is not supported on CPU here ({why}); "
                                   "training in fp32")
                    self.precision = "fp32"
            if cfg.parallel.compile:
                model.compile_blocks(whole=cfg.parallel.compile_attention)
                self.loss_fn = compiled_token_loss_sum()
            self.model = apply_fsdp(model, self.precision, cfg.parallel.reshard_after_forward)
            self.optimizer = make_optimizer(self.model, cfg.optim)
        else:
            self.model = model
            self.optimizer = make_optimizer(model, cfg.optim)
            self.engine = apply_deepspeed(model, self.optimizer, cfg.parallel.deepspeed_config, d.batch_size,
                                          cfg.optim.grad_clip, self.precision, info.device, cfg.optim.grad_accum)
        self.step = 0
        self.stop_signal = False  # set by the SIGTERM handler on this rank
        self.terminated = False
        self.stop_votes = torch.zeros(())  # how many ranks had the signal at the last step
        # filled in place each step: a new tensor from a Python float would be a blocking host-to-device
        # copy, which stalls the CPU until the GPU drains and costs ~15% of a 125M model's step time
        self._stop_flag = torch.zeros((), dtype=torch.float64, device=info.device)
        self.gc_seconds = self._gc_started = self._gc_logged = 0.0
        self.peak = device_peak_flops(info.device, cfg.log.peak_flops)
        self.flops_per_token = self.mcfg.flops_per_token(self.manifest.seq_len)
        self.validator = Validator.open(cfg, info, self.manifest, self.mcfg.vocab_size, self.mcfg.max_seq_len)
        self.last_eval: dict[str, Any] = {}  # the last validation pass's figures, kept in checkpoints

    # ----------------------------------------------------------------------------- checkpoints

    def trainer_state(self) -> dict[str, Any]:
        return {"model": self.mcfg.to_dict(), "strategy": self.cfg.parallel.strategy,
                "precision": self.precision, "world": self.info.world, "epoch": self.loader.epoch,
                "grad_accum": self.cfg.optim.grad_accum, "source_tokens": self._consumed(),
                **({"eval": self.last_eval} if self.last_eval else {})}

    def _consumed(self) -> dict[str, int]:
        """Non-padding tokens consumed per mixture source, over all ranks, since the run's first step."""
        return {n: int(v) for n, v in zip(self.source_names, self.source_tokens.tolist(), strict=True)}

    def save(self) -> Path:
        return ckpt.save(self.out, self.step, self.model, self.optimizer, self.loader.state_dict(),
                         self.trainer_state(), self.cfg.checkpoint.keep, self.engine)

    def resume(self, path: Path) -> None:
        trainer, loader_state = ckpt.load(path, self.model, self.optimizer, self.engine)
        if trainer.get("model") != self.mcfg.to_dict():
            raise ckpt.CheckpointError(f"{path}: the checkpoint's model config differs from this run's")
        if trainer.get("world") != self.info.world:
            raise ckpt.CheckpointError(f"{path}: saved with {trainer.get('world')} rank(s), "
                                       f"resuming with {self.info.world}")
        saved_accum = trainer.get("grad_accum", 1)
        if saved_accum != self.cfg.optim.grad_accum:
            # the same schedule over other tokens per step would silently be another run
            raise ckpt.CheckpointError(f"{path}: saved with optim.grad_accum={saved_accum}, resuming with "
                                       f"{self.cfg.optim.grad_accum}")
        try:
            self.loader.load_state_dict(loader_state)
        except LoaderError as exc:
            raise ckpt.CheckpointError(f"{path}: {exc}") from None
        self.step = int(trainer["step"])
        self.last_eval = trainer.get("eval") or {}
        saved = trainer.get("source_tokens") or {}
        self.source_tokens.copy_(torch.tensor([float(saved.get(n, 0)) for n in self.source_names],
                                              dtype=torch.float64))

    # ------------------------------------------------------------------------------------ step

    def train_step(self, micro_batches: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor, GradNorm]:
        """One optimizer step over ``optim.grad_accum`` micro-batches. Every token that carries loss
        weighs the same whichever micro-batch or rank it is in: each micro-batch's loss sum is
        divided by the global count over all of them, so accumulating k micro-batches of b rows
        computes the same update as one batch of k * b rows."""
        dev = self.info.device
        inputs = [batch_inputs(b, dev) for b in micro_batches]  # as the validation pass does
        # one small all-reduce: the global count of tokens that carry loss this step, and whether any
        # rank was asked to stop (SIGTERM), so that all ranks checkpoint the same step and leave
        local = torch.stack([(labels != IGNORE_INDEX).sum() for _, _, labels, _ in inputs]).sum()
        counts = torch.stack([local.to(torch.float64), self._stop_flag.fill_(float(self.stop_signal))])
        if self.source_names:  # a mixture: each source's tokens this step ride on the same all-reduce
            per_source = torch.tensor([sum(b["source_tokens"][i] for b in micro_batches)
                                       for i in range(len(self.source_names))], dtype=torch.float64)
            counts = torch.cat([counts, per_source.to(dev, non_blocking=True)])
        dist.all_reduce(counts)
        self.source_tokens += counts[2:]
        valid = counts[0]
        self.stop_votes = counts[1]  # read by fit() every few steps: reading it costs a GPU sync
        denom = valid.clamp(min=1.0).to(torch.float32)
        lr = lr_at(self.step + 1, self.cfg.optim)
        world, accum = self.info.world, len(inputs)
        loss_total = torch.zeros((), dtype=torch.float64, device=dev)
        gnorm: GradNorm
        if self.engine is not None:
            for g in self.engine.optimizer.param_groups:
                g["lr"] = lr
            for ids, pos, labels, mask in inputs:
                loss_sum = self.loss_fn(self.engine(ids, pos, mask), labels)
                # DeepSpeed divides by its gradient_accumulation_steps and averages over ranks
                self.engine.backward(loss_sum * (world * accum) / denom)
                self.engine.step()  # applies the update only at the accumulation boundary
                loss_total += loss_sum.detach()
            gnorm = _grad_norm(self.engine.get_global_grad_norm())
        else:
            for g in self.optimizer.param_groups:
                g["lr"] = lr
            for i, (ids, pos, labels, mask) in enumerate(inputs):
                if accum > 1 and self.cfg.parallel.defer_grad_sync:
                    # FSDP2: reduce-scatter once, after the last micro-batch; until then every rank
                    # holds unsharded fp32 gradients (4 bytes per parameter), so this is opt-in
                    cast("FSDPModule", self.model).set_requires_gradient_sync(i == accum - 1)
                loss_sum = self.loss_fn(self.model(ids, pos, mask), labels)
                (loss_sum * world / denom).backward()
                loss_total += loss_sum.detach()
            clip = self.cfg.optim.grad_clip or float("inf")
            gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)  # read at log time
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return loss_total, valid, gnorm

    def fit(self, stop_at: int | None = None) -> dict[str, Any]:
        cfg, info = self.cfg, self.info
        max_steps = cfg.optim.max_steps
        logger = MetricsLogger(self.out, info.rank == 0, cfg.log.tensorboard)
        batch_tokens = cfg.data.batch_size * cfg.optim.grad_accum * self.manifest.seq_len
        window = _Window.on(info.device)
        last: dict[str, Any] = {}
        t0 = time.perf_counter()
        batches = iter(self.loader)
        stopped = False
        first_step = self.step
        gc_every = cfg.parallel.gc_every
        gc.callbacks.append(self._time_gc)
        gc_was_enabled = gc.isenabled()
        if gc_every:
            # a full collection over torch.compile's many objects pauses training mid-step (a visibly slow
            # window in the metrics); collect young objects on a fixed cadence
            gc.disable()
            gc.collect(1)
        try:
            while self.step < max_steps:
                micro = [next(batches) for _ in range(cfg.optim.grad_accum)]
                loss_sum, valid, gnorm = self.train_step(micro)
                if gc_every and self.step % gc_every == 0:
                    gc.collect(1)
                window.add(loss_sum, valid, sum(b["tokens"] for b in micro), gnorm)
                if self.step % cfg.log.every == 0 or self.step == max_steps or self.step == stop_at:
                    last = self._log(logger, window, t0, batch_tokens)
                    window.reset()
                    t0 = time.perf_counter()
                if self.validator is not None and self.validator.due(self.step, max_steps):
                    last.update(self._evaluate(self.validator, logger))  # before this step's checkpoint, which keeps it
                every = cfg.checkpoint.every
                if self.step == stop_at:
                    path = self.save()
                    say(info.rank, f"stopped at step {self.step}; checkpoint {path}")
                    stopped = True
                    break
                if (info.device.type == "cpu" or self.step % STOP_CHECK_EVERY == 0) and float(self.stop_votes) > 0:
                    path = self.save()
                    say(info.rank, f"terminated (SIGTERM) at step {self.step}; checkpoint {path}")
                    self.terminated = stopped = True
                    break
                if every and self.step % every == 0 and self.step != max_steps:
                    self.save()
            if not stopped and cfg.checkpoint.at_end and self.step > first_step:
                self.save()  # (nothing new to save when a finished run is resumed)
        finally:
            gc.callbacks.remove(self._time_gc)
            if gc_every and gc_was_enabled:
                gc.enable()
            logger.close()
            del batches
        return {"step": self.step, **last}

    def _evaluate(self, validator: Validator, logger: MetricsLogger) -> dict[str, Any]:
        """A validation pass on every rank (collective), logged as one ``eval`` metrics line."""
        values = validator.run(self.engine if self.engine is not None else self.model)
        self.last_eval = {"step": self.step, **values}
        logger.log(self.step, values, group="eval")
        return values

    def _time_gc(self, phase: str, _info: dict[str, Any]) -> None:
        """gc callback: total seconds spent in Python's garbage collector (logged as ``gc_s``)."""
        now = time.perf_counter()
        if phase == "start":
            self._gc_started = now
        else:
            self.gc_seconds += now - self._gc_started

    def _log(self, logger: MetricsLogger, window: _Window, t0: float, batch_tokens: int) -> dict[str, Any]:
        info = self.info
        gc_s, self._gc_logged = self.gc_seconds - self._gc_logged, self.gc_seconds
        dt = max(time.perf_counter() - t0, 1e-9)
        # window.valid already holds global counts (reduced every step); loss and tokens are local
        stats = torch.stack([window.loss,
                             torch.tensor(float(window.tokens), dtype=torch.float64, device=info.device)])
        dist.all_reduce(stats)
        valid = float(window.valid)
        loss = float(stats[0]) / max(valid, 1.0)
        processed = batch_tokens * window.steps * info.world  # padded tokens the model computed on
        mfu = None
        if self.peak:
            mfu = processed * self.flops_per_token / dt / (self.peak * info.world)
        values = {"epoch": self.loader.epoch, "loss": loss, "ppl": math.exp(min(loss, 50.0)),
                  "grad_norm": _grad_norm(window.gnorm), "lr": lr_at(self.step, self.cfg.optim),
                  "tokens_per_s": float(stats[1]) / dt, "processed_tokens_per_s": processed / dt,
                  "loss_tokens": int(valid), "mfu": mfu, "gc_s": gc_s, **memory_stats(info.device),
                  **{f"source_tokens.{n}": v for n, v in self._consumed().items()}}
        logger.log(self.step, values)
        return values


def _one_line(exc: BaseException) -> str:
    """A DataLoader worker's error arrives with the worker traceback in its message: keep the cause."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    last = lines[-1]
    for prefix in ("pipeline.shard_source.ShardReadError: ", "ShardReadError: "):
        if last.startswith(prefix):
            return last[len(prefix):]
    return last if len(lines) > 1 and "Traceback" in str(exc) else lines[0]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill train", description=__doc__.splitlines()[0])
    p.add_argument("--config", help="YAML/JSON training config (training/configs/*.yaml)")
    p.add_argument("--data", help="shard set (a directory or http(s) base URL) or mixture file (.json, path or "
                                  "URL; tokenmill mix) (overrides data.path)")
    p.add_argument("--out", help="output folder for metrics and checkpoints (overrides out_dir)")
    p.add_argument("--max-steps", type=int, help="overrides optim.max_steps")
    p.add_argument("--stop-at", type=int, help="checkpoint and exit after this step (as if preempted)")
    p.add_argument("--resume", default="auto",
                   help="'auto' (latest checkpoint in the output folder), 'none', or a checkpoint folder")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config field, e.g. --set model.preset=tiny --set data.batch_size=4")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = list(args.set)
    if args.data:
        overrides.append(f"data.path={json.dumps(args.data)}")
    if args.out:
        overrides.append(f"out_dir={json.dumps(args.out)}")
    if args.max_steps is not None:
        overrides.append(f"optim.max_steps={args.max_steps}")
    try:
        cfg = load_config(args.config, overrides)
        if not cfg.data.path:
            raise ConfigError("data.path: required (or pass --data)")
    except ConfigError as exc:
        print(f"tokenmill train: {exc}", file=sys.stderr)
        return 2
    info = init_distributed()
    try:
        trainer = Trainer(cfg, info)
        if info.rank == 0:
            Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
            (Path(cfg.out_dir) / "config.json").write_text(cfg.model_dump_json(indent=1) + "\n")
        path = None
        if args.resume == "auto":
            path = ckpt.latest_checkpoint(cfg.out_dir)
        elif args.resume != "none":
            path = Path(args.resume)
        if path is not None:
            trainer.resume(path)
            say(info.rank, f"resumed from {path} at step {trainer.step}")
        say(info.rank, f"{trainer.mcfg.num_params() / 1e6:.2f}M params, {info.world} rank(s) on "
                       f"{info.device.type}, {cfg.parallel.strategy} {trainer.precision}, attention "
                       f"{trainer.backend}, {trainer.loader.batches_per_epoch // cfg.optim.grad_accum} steps "
                       f"per epoch")
        signal.signal(signal.SIGTERM, lambda *_: setattr(trainer, "stop_signal", True))
        result = trainer.fit(stop_at=args.stop_at)
        if trainer.terminated:
            return EXIT_TERMINATED
        if info.rank == 0:
            print(json.dumps({"train": "done", **{k: v for k, v in result.items() if v is not None}}))
        return 0
    except (LoaderError, ConfigError, ckpt.CheckpointError) as exc:
        print(f"tokenmill train: rank {info.rank}: {_one_line(exc)}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:  # an optional extra (DeepSpeed's), under torchrun too: which one, in one line
        message = missing_extra_message("tokenmill train", exc)
        if message is None:
            raise
        if info.rank == 0:
            print(f"error: {message}", file=sys.stderr)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
