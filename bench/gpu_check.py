"""One GPU session's worth of checks for the trainer: attention backends and training MFU on CUDA.

1. Correctness: every document-masked attention backend available on the GPU (flash-attn varlen,
   PyTorch varlen, FlexAttention, SDPA) against the fp32 reference, forward and backward, in bf16,
   with grouped-query attention too; and a torch.compile'd model against the eager one.
2. Speed: tokens/s and MFU of real training steps (FSDP2 with bf16 params / fp32 reduce, AdamW,
   clipping, the trainer's loss) for the ~125M and ~350M presets at seq_len 2048, on packed batches
   with document masking, eager and compiled. MFU = 6N + attention FLOPs per token over the
   device's dense bf16 peak (H100/H200: 989 TFLOP/s); the goal is >= 40%.

Prints a table and ends with one JSON line. Sized to finish in ~6-8 minutes on one H200
(``--budget-s`` skips the remaining speed runs when time is short). ``--device cpu --sizes tiny
--seq-len 128 --steps 2`` runs the same code paths on a CPU, as a smoke test of the script itself.
Needs only torch (CUDA build) and numpy.
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

# the repo root instead of bench/ on sys.path: bench/tokenize.py would shadow the stdlib's tokenize
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import gc
import json
import time
import traceback

import numpy as np
import torch

from kernels.attention import DocMask, available_backends, doc_attention, select_backend
from pipeline.shard_format import Sample
from training.data import collate
from training.metrics import device_peak_flops
from training.model import PRESETS, Llama, ModelConfig, token_loss_sum

GOAL_MFU = 0.40


def packed_samples(n: int, seq_len: int, vocab: int, rng: np.random.Generator) -> list[Sample]:
    """Packed sequences like the pipeline's: documents of mixed lengths filling ~97% of a row."""
    out = []
    for i in range(n):
        lens: list[int] = []
        target = int(seq_len * rng.uniform(0.94, 1.0))
        while sum(lens) < target:
            lens.append(int(min(rng.choice([64, 200, 500, 1200, 2048]) * rng.uniform(0.3, 1.0), target - sum(lens))))
        lens = [x for x in lens if x > 0]
        ids = rng.integers(0, vocab, sum(lens))
        out.append(Sample(str(i), ids, np.array(lens), None, {}))
    return out


# ------------------------------------------------------------------------------------ correctness


def check_backends(device: torch.device, seq_len: int) -> dict[str, dict]:
    rng = np.random.default_rng(0)
    b, h, d = 2, 8, 64
    samples = packed_samples(b, seq_len, 100, rng)
    batch = collate(samples, seq_len, 0)
    mask = DocMask(batch["cu_seqlens"].to(device), batch["max_seqlen"], batch["seq_ids"].to(device))
    results: dict[str, dict] = {}
    for hkv in (h, 2):
        g = torch.Generator(device=device).manual_seed(hkv)
        q = torch.randn(b, seq_len, h, d, device=device, generator=g, dtype=torch.bfloat16)
        k = torch.randn(b, seq_len, hkv, d, device=device, generator=g, dtype=torch.bfloat16)
        v = torch.randn(b, seq_len, hkv, d, device=device, generator=g, dtype=torch.bfloat16)
        dout = torch.randn(b, seq_len, h, d, device=device, generator=g, dtype=torch.bfloat16)

        def run(name: str, dtype: torch.dtype, q=q, k=k, v=v, dout=dout):
            qq, kk, vv = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
            out = doc_attention(qq, kk, vv, mask, name)
            out.backward(dout.to(out.dtype))
            return out.detach().float(), [t.grad.float() for t in (qq, kk, vv)]

        ref_out, ref_grads = run("reference", torch.float32)
        for name in available_backends(device, training=True):
            if name == "reference":
                continue
            key = f"{name}{'' if hkv == h else '+gqa'}"
            try:
                out, grads = run(name, torch.bfloat16)
                err = max([(out - ref_out).abs().max().item()]
                          + [(g - r).abs().max().item() / max(r.abs().max().item(), 1e-6)
                             for g, r in zip(grads, ref_grads, strict=True)])
                results[key] = {"max_err": err, "ok": err < 5e-2}
            except Exception as exc:  # report, keep checking the others
                results[key] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    return results


def check_compile(device: torch.device, backend: str, seq_len: int) -> dict:
    """A compiled model gives the eager model's loss and gradients (same weights, same batch)."""
    cfg = ModelConfig(vocab_size=1024, dim=256, n_layers=2, n_heads=4, max_seq_len=seq_len)
    torch.manual_seed(0)
    eager = Llama(cfg, backend).to(device)
    compiled = Llama(cfg, backend).to(device)
    compiled.load_state_dict(eager.state_dict())
    compiled.compile_blocks()
    rng = np.random.default_rng(1)
    results = []
    for _ in range(2):  # two different segment layouts: the second must not need a recompile to be right
        batch = collate(packed_samples(2, seq_len, 1024, rng), seq_len, 0)
        mask = DocMask(batch["cu_seqlens"].to(device), batch["max_seqlen"], batch["seq_ids"].to(device))
        ids, pos = batch["input_ids"].to(device), batch["position_ids"].to(device)
        labels = batch["labels"].to(device)
        losses = []
        for model in (eager, compiled):
            model.zero_grad()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = token_loss_sum(model(ids, pos, mask), labels) / (labels != -100).sum()
            loss.backward()
            losses.append(loss.item())
        gerr = max((a.grad - b.grad).abs().max().item() / max(a.grad.abs().max().item(), 1e-8)
                   for a, b in zip(eager.parameters(), compiled.parameters(), strict=True))
        results.append({"loss_eager": losses[0], "loss_compiled": losses[1], "grad_rel_err": gerr})
    ok = all(abs(r["loss_eager"] - r["loss_compiled"]) < 2e-2 and r["grad_rel_err"] < 5e-2 for r in results)
    return {"ok": ok, "runs": results}


# ------------------------------------------------------------------------------------------ speed


def train_speed(device: torch.device, size: str, seq_len: int, micro_batch: int, steps: int, warmup: int,
                compile_model: bool, backend: str, vocab: int) -> dict:
    from training.config import OptimConfig
    from training.parallel import apply_fsdp
    from training.train import lr_at, make_optimizer

    cfg = ModelConfig(vocab_size=vocab, max_seq_len=seq_len, **PRESETS[size])
    torch.manual_seed(0)
    model = Llama(cfg, backend).to(device)
    if compile_model:
        model.compile_blocks()
    model = apply_fsdp(model, "bf16", reshard_after_forward=False)
    opt_cfg = OptimConfig(lr=3e-4, warmup_steps=10, max_steps=1000)
    optimizer = make_optimizer(model, opt_cfg)
    rng = np.random.default_rng(2)
    batches = []
    for _ in range(4):
        b = collate(packed_samples(micro_batch, seq_len, vocab, rng), seq_len, 0)
        if device.type == "cuda":
            b = {k: (v.pin_memory() if isinstance(v, torch.Tensor) else v) for k, v in b.items()}
        batches.append(b)

    def step(i: int) -> torch.Tensor:
        b = batches[i % len(batches)]
        ids = b["input_ids"].to(device, non_blocking=True)
        pos = b["position_ids"].to(device, non_blocking=True)
        labels = b["labels"].to(device, non_blocking=True)
        mask = DocMask(b["cu_seqlens"].to(device, non_blocking=True), b["max_seqlen"],
                       b["seq_ids"].to(device, non_blocking=True))
        for g in optimizer.param_groups:
            g["lr"] = lr_at(i + 1, opt_cfg)
        valid = (labels != -100).sum().clamp(min=1)
        loss = token_loss_sum(model(ids, pos, mask), labels) / valid
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for i in range(warmup):
        step(i)
    sync()
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    losses = [step(warmup + i) for i in range(steps)]
    sync()
    secs = time.perf_counter() - t0
    processed = micro_batch * seq_len * steps
    real = sum(batches[(warmup + i) % len(batches)]["tokens"] for i in range(steps))
    peak = device_peak_flops(device)
    fpt = cfg.flops_per_token(seq_len)
    result = {
        "model": size, "params_m": round(cfg.num_params() / 1e6, 1), "compile": compile_model, "backend": backend,
        "micro_batch": micro_batch, "seq_len": seq_len, "step_s": secs / steps, "warmup_s": warm_s,
        "tokens_per_s": processed / secs, "real_tokens_per_s": real / secs,
        "tflops": processed * fpt / secs / 1e12, "mfu": (processed * fpt / secs / peak) if peak else None,
        "loss_first": float(losses[0]), "loss_last": float(losses[-1]),
    }
    if device.type == "cuda":
        result["mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


# ------------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sizes", nargs="*", default=["125m", "350m"])
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, nargs="*", default=[16, 8], help="per size, in order")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--modes", nargs="*", default=["eager", "compile"])
    ap.add_argument("--budget-s", type=float, default=300, help="skip speed runs after this many seconds")
    args = ap.parse_args()
    t_start = time.perf_counter()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"bench": "gpu_check", "error": "CUDA is not available to this torch build "
                          f"({torch.__version__}); install a CUDA torch"}))
        sys.exit(1)
    from training.parallel import init_distributed

    init_distributed()  # a one-process group: FSDP2 needs one
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = device_peak_flops(device)
    backend = select_backend(device)
    print(f"device {name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"peak bf16 {peak / 1e12 if peak else float('nan'):.0f} TFLOP/s")
    print(f"attention backends: {available_backends(device)}; trainer default: {backend}")

    print(f"\n== attention backends vs fp32 reference (bf16, fwd + bwd, seq {args.seq_len}) ==")
    backends = check_backends(device, args.seq_len)
    for k, v in backends.items():
        detail = f"max err {v['max_err']:.3g}" if "max_err" in v else v.get("error", "")
        print(f"  {k:<16} {'OK ' if v['ok'] else 'FAIL'}  {detail}")
    try:
        compiled = check_compile(device, backend, min(args.seq_len, 512))
    except Exception as exc:
        compiled = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    verdict = "OK" if compiled["ok"] else "FAIL"
    print(f"  compiled model vs eager: {verdict} {compiled.get('runs', compiled.get('error'))}")

    print("\n== training step speed (FSDP2 bf16, AdamW, doc-masked packed batches) ==")
    print(f"{'model':<6}{'params':>8}{'mode':>9}{'mb':>4}{'step s':>9}{'tok/s':>12}{'TFLOP/s':>9}"
          f"{'MFU':>7}{'mem GB':>8}")
    runs: list[dict] = []
    for i, size in enumerate(args.sizes):
        mb = args.micro_batch[min(i, len(args.micro_batch) - 1)]
        for mode in args.modes:
            elapsed = time.perf_counter() - t_start
            if elapsed > args.budget_s:
                runs.append({"model": size, "compile": mode == "compile", "skipped": f"budget ({elapsed:.0f}s)"})
                print(f"{size:<6}{'':>8}{mode:>9}  skipped: time budget")
                continue
            try:
                r = train_speed(device, size, args.seq_len, mb, args.steps, args.warmup, mode == "compile",
                                backend, args.vocab)
            except Exception as exc:
                traceback.print_exc(limit=3)
                r = {"model": size, "compile": mode == "compile", "error": f"{type(exc).__name__}: "
                     f"{str(exc).splitlines()[0][:300]}"}
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                print(f"{size:<6}{'':>8}{mode:>9}  error: {r['error']}")
                runs.append(r)
                continue
            runs.append(r)
            # one line per finished run, so a run cut short by the device's time limit still reports
            print(json.dumps({"bench": "gpu_check_partial", **r}), flush=True)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
            print(f"{size:<6}{r['params_m']:>7.0f}M{mode:>9}{mb:>4}{r['step_s']:>9.3f}{r['tokens_per_s']:>12,.0f}"
                  f"{r['tflops']:>9.1f}{mfu:>7}{r.get('mem_gb', 0):>8.1f}")

    best = {}
    for size in args.sizes:
        mfus = [r["mfu"] for r in runs if r.get("model") == size and r.get("mfu") is not None]
        best[size] = max(mfus) if mfus else None
    print(json.dumps({
        "bench": "gpu_check", "device": name, "torch": torch.__version__, "backend": backend,
        "backends_ok": all(v["ok"] for v in backends.values()), "backends": backends,
        "compile_ok": compiled["ok"], "runs": runs,
        "best_mfu": best, "mfu": min((v for v in best.values() if v is not None), default=None),
        "goal": GOAL_MFU, "seconds": round(time.perf_counter() - t_start, 1),
    }))


if __name__ == "__main__":
    main()
