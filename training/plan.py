"""``tokenmill plan``: the sizing figures users otherwise work out by hand.

- Chinchilla (Hoffmann et al. 2022): training compute C ~ 6 N D, and the compute-optimal data is
  about 20 tokens per parameter (D ~ 20 N), so for a budget C: N = sqrt(C / 120), D = 20 N; for a
  finished shard set of D tokens: N = D / 20.
- Memory per device for mixed-precision Adam, ZeRO accounting (Rajbhandari et al. 2020): 2 bytes of
  bf16 weights, 2 of bf16 gradients and 12 of fp32 master weights + Adam moments per parameter;
  ZeRO-1 shards the 12, ZeRO-2 also the gradients, ZeRO-3 / FSDP full sharding everything, each over
  the sharding degree. (fp32 training: 4 + 4 + 8 bytes.)
- Activations per layer (Korthikanti et al. 2022, no tensor parallelism): 34 s b h bytes, plus
  5 a s^2 b when attention scores are materialised (not with flash attention), plus the logits
  6 s b V (bf16 + fp32 for the loss). Full activation checkpointing keeps 2 s b h per layer plus one
  layer being recomputed.
- Time and cost: GPU-hours = C / (peak x MFU) / 3600.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.mixture_source import is_mixture, read_mixture
from pipeline.shard_source import ShardSource

GIB = 2**30
TOKENS_PER_PARAM = 20.0


def chinchilla_from_compute(compute: float, tokens_per_param: float = TOKENS_PER_PARAM) -> tuple[float, float]:
    """(params, tokens) that spend ``compute`` FLOPs compute-optimally."""
    n = math.sqrt(compute / (6.0 * tokens_per_param))
    return n, tokens_per_param * n


def chinchilla_from_tokens(tokens: float, tokens_per_param: float = TOKENS_PER_PARAM) -> tuple[float, float]:
    """(params, compute) for which ``tokens`` is the compute-optimal amount of data."""
    n = tokens / tokens_per_param
    return n, 6.0 * n * tokens


@dataclass
class Memory:
    weights: float
    grads: float
    optimizer: float
    activations: float | None

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + (self.activations or 0.0)


def state_memory(params: float, zero_stage: int, shard_degree: int, precision: str = "bf16") -> Memory:
    """Bytes per device for weights, gradients and optimizer state (no activations)."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero stage must be 0-3, got {zero_stage}")
    if shard_degree < 1:
        raise ValueError(f"sharding degree must be >= 1, got {shard_degree}")
    w, g, o = (2.0, 2.0, 12.0) if precision == "bf16" else (4.0, 4.0, 8.0)
    d = float(shard_degree)
    return Memory(
        weights=params * w / (d if zero_stage >= 3 else 1),
        grads=params * g / (d if zero_stage >= 2 else 1),
        optimizer=params * o / (d if zero_stage >= 1 else 1),
        activations=None,
    )


def activation_memory(layers: int, dim: int, heads: int, seq_len: int, micro_batch: int, vocab: int,
                      flash: bool = True, checkpointing: bool = False) -> float:
    """Activation bytes per device for one micro-batch (see the module docstring)."""
    s, b, h, a = float(seq_len), float(micro_batch), float(dim), float(heads)
    per_layer = 34.0 * s * b * h + (0.0 if flash else 5.0 * a * s * s * b)
    logits = 6.0 * s * b * vocab
    if checkpointing:
        return layers * 2.0 * s * b * h + per_layer + logits
    return layers * per_layer + logits


def gpu_hours(compute: float, peak_flops: float, mfu: float) -> float:
    if peak_flops <= 0 or not 0 < mfu <= 1:
        raise ValueError("peak must be > 0 and MFU in (0, 1]")
    return compute / (peak_flops * mfu) / 3600.0


@dataclass
class Plan:
    params: float
    tokens: float
    compute: float
    basis: str
    gpus: int
    zero_stage: int
    shard_degree: int
    memory_per_gpu_gib: dict[str, float | None]
    gpu_hours: float
    wall_hours: float
    cost: float | None


def make_plan(*, compute: float | None = None, tokens: float | None = None, params: float | None = None,
              arch: dict[str, int] | None = None, seq_len: int = 2048, micro_batch: int = 8, gpus: int = 8,
              zero_stage: int = 3, shard_degree: int | None = None, precision: str = "bf16",
              peak_flops: float = 989e12, mfu: float = 0.4, price: float | None = None,
              tokens_per_param: float = TOKENS_PER_PARAM, flash: bool = True,
              checkpointing: bool = False) -> Plan:
    given = sum(x is not None for x in (compute, tokens, params))
    if given == 3:
        raise ValueError("give at most two of compute, tokens and params")
    if compute is not None and params is not None:
        tokens = compute / (6.0 * params)
        basis = "tokens the compute budget buys for the model size"
    elif compute is not None and tokens is not None:
        params = compute / (6.0 * tokens)
        basis = "model size the compute budget allows for the tokens"
    elif compute is not None:
        params, tokens = chinchilla_from_compute(compute, tokens_per_param)
        basis = "chinchilla-optimal for the compute budget"
    elif tokens is not None and params is None:
        params, compute = chinchilla_from_tokens(tokens, tokens_per_param)
        basis = "chinchilla-optimal for the token count"
    elif params is not None and tokens is None:
        tokens = tokens_per_param * params
        compute = 6.0 * params * tokens
        basis = "chinchilla-optimal tokens for the model size"
    elif params is not None and tokens is not None:
        compute = 6.0 * params * tokens
        basis = "given model size and tokens"
    else:
        raise ValueError("give --compute, --tokens/--data, or --params")
    degree = shard_degree or gpus
    mem = state_memory(params, zero_stage, degree, precision)
    if arch:
        mem.activations = activation_memory(arch["layers"], arch["dim"], arch["heads"], seq_len, micro_batch,
                                            arch["vocab"], flash, checkpointing)
    hours = gpu_hours(compute, peak_flops, mfu)
    return Plan(
        params=params, tokens=tokens, compute=compute, basis=basis, gpus=gpus, zero_stage=zero_stage,
        shard_degree=degree,
        memory_per_gpu_gib={"weights": mem.weights / GIB, "grads": mem.grads / GIB,
                            "optimizer": mem.optimizer / GIB,
                            "activations": None if mem.activations is None else mem.activations / GIB,
                            "total": mem.total / GIB},
        gpu_hours=hours, wall_hours=hours / gpus, cost=None if price is None else hours * price,
    )


def _num(text: str) -> float:
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill plan", description="Chinchilla sizing, memory, GPU-hours and cost.")
    what = p.add_argument_group("what to size: any one or two of compute, tokens (or data), params")
    what.add_argument("--compute", type=_num, help="training FLOP budget, e.g. 1e21")
    what.add_argument("--tokens", type=_num, help="training tokens, e.g. 2e10")
    what.add_argument("--data", help="a shard set (directory or URL): its manifest's token count; or a mixture "
                      "file (mixture.json): its planned tokens, with tokens and epochs per source")
    what.add_argument("--params", type=_num, help="model parameters, e.g. 350e6")
    what.add_argument("--preset", help="a training/model.py preset (with --vocab) for params and shapes")
    what.add_argument("--layers", type=int)
    what.add_argument("--dim", type=int)
    what.add_argument("--heads", type=int)
    what.add_argument("--vocab", type=int, default=32000)
    what.add_argument("--tokens-per-param", type=_num, default=TOKENS_PER_PARAM)
    run = p.add_argument_group("how it runs")
    run.add_argument("--seq-len", type=int, default=2048)
    run.add_argument("--micro-batch", type=int, default=8, help="sequences per GPU per step")
    run.add_argument("--gpus", type=int, default=8)
    run.add_argument("--zero-stage", type=int, default=3, choices=[0, 1, 2, 3], help="3 = FSDP full sharding")
    run.add_argument("--shard-degree", type=int, help="default: --gpus")
    run.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    run.add_argument("--no-flash", action="store_true", help="attention scores are materialised")
    run.add_argument("--checkpointing", action="store_true", help="full activation checkpointing")
    run.add_argument("--peak", type=_num, default=989e12, help="per-GPU peak FLOP/s (H100/H200 bf16: 989e12)")
    run.add_argument("--mfu", type=_num, default=0.4)
    run.add_argument("--price", type=_num, help="cost per GPU-hour")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    return p


def _arch(args: argparse.Namespace) -> tuple[dict[str, int] | None, float | None]:
    """Layer shapes (for activations) and a parameter count, from a preset or --layers/--dim."""
    if args.preset:
        from training.model import PRESETS, ModelConfig  # imports torch: planning without a preset needs none

        if args.preset not in PRESETS:
            raise ValueError(f"--preset: unknown {args.preset!r} (known: {', '.join(PRESETS)})")
        cfg = ModelConfig(vocab_size=args.vocab, max_seq_len=args.seq_len, **PRESETS[args.preset])
        return {"layers": cfg.n_layers, "dim": cfg.dim, "heads": cfg.n_heads, "vocab": args.vocab}, cfg.num_params()
    if args.layers and args.dim:
        heads = args.heads or max(1, args.dim // 64)
        return {"layers": args.layers, "dim": args.dim, "heads": heads, "vocab": args.vocab}, None
    return None, None


def _data_tokens(location: str) -> tuple[float, list[dict[str, Any]]]:
    """Non-padding tokens of a shard set or mixture, and a mixture's sources (tokens, samples, epochs)."""
    if not is_mixture(location):
        return float(ShardSource(location).manifest().total_tokens), []
    mixture = read_mixture(location)[0]
    sources = [{"name": s.name, "tokens": s.tokens, "samples": s.samples, "epochs": s.epochs,
                "target_share": s.target_share, "pinned": s.pinned} for s in mixture.sources]
    return float(mixture.total_tokens), sources


def render_sources(sources: list[dict[str, Any]]) -> str:
    rows = [("source", "share", "tokens", "samples", "epochs")]
    rows += [(s["name"], f"{s['target_share']:.3f}", _fmt(s["tokens"]), str(s["samples"]), f"{s['epochs']:.2f}")
             for s in sources]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _fmt(x: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def render(plan: Plan, peak: float, mfu: float) -> str:
    m = plan.memory_per_gpu_gib
    act = "n/a (give --preset or --layers/--dim)" if m["activations"] is None else f"{m['activations']:.2f} GiB"
    rows = [
        ("basis", plan.basis),
        ("parameters", _fmt(plan.params)),
        ("tokens", _fmt(plan.tokens)),
        ("compute (6ND)", f"{plan.compute:.3e} FLOPs"),
        (f"memory/GPU (ZeRO-{plan.zero_stage}, shard {plan.shard_degree})", ""),
        ("  weights", f"{m['weights']:.2f} GiB"),
        ("  gradients", f"{m['grads']:.2f} GiB"),
        ("  optimizer", f"{m['optimizer']:.2f} GiB"),
        ("  activations", act),
        ("  total", f"{m['total']:.2f} GiB"),
        (f"GPU-hours (peak {peak:.3g}, MFU {mfu:.0%})", f"{plan.gpu_hours:,.1f}"),
        (f"wall-clock on {plan.gpus} GPUs", f"{plan.wall_hours:,.1f} h ({plan.wall_hours / 24:,.1f} days)"),
    ]
    if plan.cost is not None:
        rows.append(("cost", f"{plan.cost:,.0f}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        arch, preset_params = _arch(args)
        tokens = args.tokens
        sources: list[dict[str, Any]] = []
        if args.data:
            if tokens is not None:
                raise ValueError("give --tokens or --data, not both")
            tokens, sources = _data_tokens(args.data)
        params = args.params or preset_params
        plan = make_plan(compute=args.compute, tokens=tokens, params=params, arch=arch, seq_len=args.seq_len,
                         micro_batch=args.micro_batch, gpus=args.gpus, zero_stage=args.zero_stage,
                         shard_degree=args.shard_degree, precision=args.precision, peak_flops=args.peak,
                         mfu=args.mfu, price=args.price, tokens_per_param=args.tokens_per_param,
                         flash=not args.no_flash, checkpointing=args.checkpointing)
    except (ValueError, RuntimeError) as exc:
        print(f"tokenmill plan: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    record: dict[str, Any] = {"plan": asdict(plan), "peak_flops": args.peak, "mfu": args.mfu}
    if sources:
        record["sources"] = sources
    if not args.json:
        if sources:
            print(render_sources(sources) + "\n")
        print(render(plan, args.peak, args.mfu))
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
