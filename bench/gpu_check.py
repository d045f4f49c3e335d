"""One GPU session's worth of checks for the trainer: attention backends and training MFU on CUDA.

1. Correctness: every document-masked attention backend available on the GPU (flash-attn varlen,
   PyTorch varlen, FlexAttention, SDPA) against the fp32 reference, forward and backward, in bf16,
   with grouped-query attention too; and a torch.compile'd model against the eager one.
2. Speed: tokens/s and MFU of real training steps (FSDP2 with bf16 params / fp32 reduce, AdamW,
   clipping, the trainer's loss) for the ~125M and ~350M presets at seq_len 2048, on packed batches
   with document masking: eager, compiled (whole blocks, attention in the graph, as the trainer's
   ``parallel.compile`` does), and variants (dense parts only; no FSDP wrapper; larger batches).
   MFU = 6N + attention FLOPs per token over the device's dense bf16 peak (H100/H200:
   989 TFLOP/s); the goal is >= 40%. The measured 8192^3 bf16 matmul rate is printed beside it.

Prints a table and ends with one JSON line; the result goes to bench/results/gpu_check_<gpu>.json, or to
``--json`` (a file or a folder), rewritten after every run.
Runs go in the order of ``--runs`` (most wanted first); ``--budget-s`` starts no run after that
many seconds, so a short device lease still reports the important ones. ``--device cpu --runs
tiny:eager:2 tiny:compile:2 --seq-len 128 --steps 2`` runs the same code paths on a CPU, as a smoke
test of the script itself. Needs torch (a CUDA build), numpy, pyyaml and pydantic.
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

# the repo root instead of bench/ on sys.path, so `pipeline`, `training` and `bench` import
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import gc
import json
import time
import traceback

import numpy as np
import torch

from bench.common import emit_json, save_record
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


def check_compile(device: torch.device, backend: str, seq_len: int, whole: bool = True) -> dict:
    """A compiled model gives the eager model's loss and gradients (same weights, same batch)."""
    cfg = ModelConfig(vocab_size=1024, dim=256, n_layers=2, n_heads=4, max_seq_len=seq_len)
    torch.manual_seed(0)
    eager = Llama(cfg, backend).to(device)
    compiled = Llama(cfg, backend).to(device)
    compiled.load_state_dict(eager.state_dict())
    compiled.compile_blocks(whole=whole)
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


MODES = {
    # name: (compile, whole blocks, FSDP2)
    "eager": (False, False, True),
    "compile": (True, True, True),  # what `parallel.compile: true` does: whole blocks, attention in graph
    "compile-pieces": (True, False, True),  # dense parts only, attention called eagerly in between
    "compile-nofsdp": (True, True, False),  # plain autocast bf16, no FSDP wrapper (one GPU)
}


def train_speed(device: torch.device, size: str, seq_len: int, micro_batch: int, steps: int, warmup: int,
                mode: str, backend: str, vocab: int) -> dict:
    from training.config import OptimConfig
    from training.model import compiled_token_loss_sum
    from training.parallel import apply_fsdp
    from training.train import lr_at, make_optimizer

    compile_model, whole, fsdp = MODES[mode]
    cfg = ModelConfig(vocab_size=vocab, max_seq_len=seq_len, **PRESETS[size])
    torch.manual_seed(0)
    model = Llama(cfg, backend).to(device)
    loss_fn = token_loss_sum
    if compile_model:
        model.compile_blocks(whole=whole)
        loss_fn = compiled_token_loss_sum()
    if fsdp:
        model = apply_fsdp(model, "bf16", reshard_after_forward=False)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=not fsdp)
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
        with autocast:
            logits = model(ids, pos, mask)
        loss = loss_fn(logits, labels) / valid
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    from torch._dynamo.utils import counters

    counters.clear()
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
        "model": size, "params_m": round(cfg.num_params() / 1e6, 1), "mode": mode, "backend": backend,
        "micro_batch": micro_batch, "seq_len": seq_len, "step_s": secs / steps, "warmup_s": warm_s,
        "tokens_per_s": processed / secs, "real_tokens_per_s": real / secs,
        "tflops": processed * fpt / secs / 1e12, "mfu": (processed * fpt / secs / peak) if peak else None,
        "loss_first": float(losses[0]), "loss_last": float(losses[-1]),
        # graphs compiled over all steps: a count that grows with the number of batches would mean
        # a recompile per segment layout
        "graphs_compiled": int(counters["stats"]["unique_graphs"]),
    }
    if device.type == "cuda":
        result["mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


# ------------------------------------------------------------------------------------------- main


def matmul_ceiling(device: torch.device) -> float | None:
    """Measured dense bf16 TFLOP/s of one large random matmul: what MFU's peak is next to."""
    if device.type != "cuda":
        return None
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * 8192**3 * 10 / (start.elapsed_time(end) / 1e3) / 1e12


def table_row(r: dict) -> str:
    """One line of the speed table: a finished run's figures, or why it has none."""
    if "tokens_per_s" not in r:
        return f"{r['model']:<6}{'':>8}{r['mode']:>16}  {r.get('error') or r.get('skipped')}"
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
    return (f"{r['model']:<6}{r['params_m']:>7.0f}M{r['mode']:>16}{r['micro_batch']:>4}{r['step_s']:>9.3f}"
            f"{r['tokens_per_s']:>12,.0f}{r['tflops']:>9.1f}{mfu:>7}{r.get('mem_gb', 0):>8.1f}")


def figures(report: dict) -> dict:
    """What bench/RESULTS.md shows: each speed run's tokens/s and MFU (repeated runs joined by ``/``), the
    measured matmul ceiling and the backends' largest error."""
    runs: dict[str, list] = {}
    for r in report.get("runs", []):
        if "tokens_per_s" in r:
            key = f"{r['model']} {r['mode']} mb{r['micro_batch']}"
            runs.setdefault(f"{key} tokens_per_s", []).append(round(r["tokens_per_s"]))
            runs.setdefault(f"{key} mfu", []).append(None if r["mfu"] is None else round(r["mfu"], 3))
    errors = [v["max_err"] for v in report.get("backends", {}).values() if "max_err" in v]
    out: dict = {"matmul_tflops": round(report["matmul_tflops"], 1) if report.get("matmul_tflops") else None}
    if errors:
        out["backends_max_err"] = float(f"{max(errors):.2g}")
    out.update({k: v[0] if len(v) == 1 else " / ".join(map(str, v)) for k, v in runs.items()})
    return out


def parse_plan(items: list[str]) -> list[tuple[str, str, int]]:
    """``size:mode:micro_batch`` entries, run in the order given (most wanted first)."""
    plan = []
    for item in items:
        size, mode, mb = item.split(":")
        if size not in PRESETS or mode not in MODES:
            raise SystemExit(f"bad run {item!r}: size in {sorted(PRESETS)}, mode in {sorted(MODES)}")
        plan.append((size, mode, int(mb)))
    return plan


DEFAULT_PLAN = ["125m:compile:16", "350m:compile:16", "125m:eager:16", "350m:eager:16",
                "125m:compile:32", "125m:compile-nofsdp:16", "125m:compile-pieces:16", "350m:compile:32"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", nargs="*", default=DEFAULT_PLAN, help="size:mode:micro_batch, most wanted first")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--budget-s", type=float, default=300, help="start no speed run after this many seconds")
    ap.add_argument("--json", default=None, help="write the result here, a file or a folder (rewritten after "
                    "every run), instead of bench/results/gpu_check_<gpu>.json")
    ap.add_argument("--variant", help="record the result as this named variant of the file (an A/B run)")
    ap.add_argument("--skip-checks", action="store_true", help="speed runs only (no backend/compile checks)")
    args = ap.parse_args()
    plan = parse_plan(args.runs)
    t_start = time.perf_counter()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"bench": "gpu_check", "error": "CUDA is not available to this torch build "
                          f"({torch.__version__}); install a CUDA torch"}))
        sys.exit(1)
    from training.parallel import init_distributed

    init_distributed()  # a one-process group: FSDP2 needs one
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    gpu = name if device.type == "cuda" else None
    peak = device_peak_flops(device)
    backend = select_backend(device)
    ceiling = matmul_ceiling(device)
    print(f"device {name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"peak bf16 {peak / 1e12 if peak else float('nan'):.0f} TFLOP/s, measured 8192^3 matmul "
          f"{ceiling or float('nan'):.0f} TFLOP/s")
    print(f"attention backends: {available_backends(device)}; trainer default: {backend}")
    report: dict = {"bench": "gpu_check", "device": name, "torch": torch.__version__, "backend": backend,
                    "peak_tflops": peak / 1e12 if peak else None, "matmul_tflops": ceiling, "goal": GOAL_MFU}

    def save() -> None:
        report["seconds"] = round(time.perf_counter() - t_start, 1)
        if args.json:  # after every run, so a run cut short by the device's time limit still reports
            save_record(report, Path(args.json), figures=figures(report), gpu=gpu, variant=args.variant)

    print(f"\n== attention backends vs fp32 reference (bf16, fwd + bwd, seq {args.seq_len}) ==", flush=True)
    backends = {} if args.skip_checks else check_backends(device, args.seq_len)
    for k, v in backends.items():
        detail = f"max err {v['max_err']:.3g}" if "max_err" in v else v.get("error", "")
        print(f"  {k:<16} {'OK ' if v['ok'] else 'FAIL'}  {detail}")
    report.update(backends_ok=all(v["ok"] for v in backends.values()), backends=backends)
    save()
    compiled = {}
    for whole in (True, False):
        key = "whole" if whole else "pieces"
        if args.skip_checks:
            compiled[key] = {"ok": True, "skipped": True}
            continue
        try:
            compiled[key] = check_compile(device, backend, min(args.seq_len, 512), whole)
        except Exception as exc:
            traceback.print_exc(limit=4)
            compiled[key] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        verdict = "OK" if compiled[key]["ok"] else "FAIL"
        print(f"  compiled model ({key}) vs eager: {verdict} {compiled[key].get('runs', compiled[key].get('error'))}",
              flush=True)
    report.update(compile_ok=compiled["whole"]["ok"], compile=compiled)
    save()

    print("\n== training step speed (bf16, AdamW, clipping, doc-masked packed batches) ==")
    header = (f"{'model':<6}{'params':>8}{'mode':>16}{'mb':>4}{'step s':>9}{'tok/s':>12}{'TFLOP/s':>9}"
              f"{'MFU':>7}{'mem GB':>8}")
    print(header, flush=True)
    runs: list[dict] = []
    report["runs"] = runs
    for size, mode, mb in plan:
        if mode.startswith("compile") and not compiled["whole" if mode != "compile-pieces" else "pieces"]["ok"]:
            runs.append({"model": size, "mode": mode, "skipped": "compiled model did not match eager"})
            continue
        elapsed = time.perf_counter() - t_start
        if elapsed > args.budget_s:
            runs.append({"model": size, "mode": mode, "micro_batch": mb, "skipped": f"budget ({elapsed:.0f}s)"})
            print(table_row(runs[-1]))
            continue
        try:
            r = train_speed(device, size, args.seq_len, mb, args.steps, args.warmup, mode, backend, args.vocab)
        except Exception as exc:
            traceback.print_exc(limit=4)
            r = {"model": size, "mode": mode, "micro_batch": mb,
                 "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        runs.append(r)
        # one line per finished run, so a run cut short by the device's time limit still reports
        print(json.dumps({"bench": "gpu_check_partial", **r}), flush=True)
        gc.collect()
        if device.type == "cuda":
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        print(table_row(r), flush=True)
        best = {}
        for sz in dict.fromkeys(p[0] for p in plan):
            mfus = [x["mfu"] for x in runs if x.get("model") == sz and x.get("mfu") is not None]
            best[sz] = max(mfus) if mfus else None
        report.update(best_mfu=best, mfu=min((v for v in best.values() if v is not None), default=None))
        save()

    print("\n" + header)
    for r in runs:
        print(table_row(r))
    save()
    emit_json(report, Path(args.json) if args.json else None, figures=figures(report), gpu=gpu,
              variant=args.variant)


if __name__ == "__main__":
    main()
