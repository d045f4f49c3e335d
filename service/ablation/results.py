"""``OUT/ablation.json``: what each proxy run scored, each variant's mean and seed spread, the gaps between
variants, and each variant's data (its job's funnel), read from the files the steps wrote.

Per run: bits per byte on the common validation set (``common``, and ``common.VALUE`` per ``validation.by``
value), on the variant's own validation split (``own``), each benchmark task's value, and the training loss
curve (``metrics.jsonl`` of the trainer: step, loss, and val_loss/val_bpb where the trainer evaluated).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from service.ablation.plan import Plan, Run

#: the metrics line fields a curve keeps
CURVE_FIELDS = ("step", "loss", "val_loss", "val_bpb")


def run_result(plan: Plan, run: Run) -> dict[str, Any] | None:
    """One run's scores and curve; None while its evaluation has not finished."""
    path = plan.layout.eval_json(run)
    if not path.exists():
        return None
    result = json.loads(path.read_text())
    scores = {name: _score(result, name) for name in result.get("ablation_tasks") or {}}
    return {"scores": {k: v for k, v in scores.items() if v is not None}, "curve": curve(plan.layout.run(run)),
            "eval": str(path)}


def _score(result: dict[str, Any], name: str) -> float | None:
    """The value ``tokenmill eval`` reported for the task it was given as ``name``."""
    entry = (result.get("tasks") or {}).get(name)
    value = entry.get("value") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def curve(run_dir: Path) -> list[dict[str, float]]:
    """The trainer's metrics lines (``metrics.jsonl``), the fields of :data:`CURVE_FIELDS` only; a resumed run's
    repeated steps keep their last line."""
    path = run_dir / "metrics.jsonl"
    by_step: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line) if line.strip() else {}
        if "step" in record:
            row = by_step.setdefault(int(record["step"]), {})
            row.update({k: record[k] for k in CURVE_FIELDS if k in record})
    return [by_step[s] for s in sorted(by_step)]


def summary(values: list[float]) -> dict[str, float] | None:
    """Mean, spread (max - min over seeds) and the values; None for none."""
    if not values:
        return None
    return {"mean": statistics.fmean(values), "spread": max(values) - min(values), "n": len(values),
            "min": min(values), "max": max(values)}


def funnel(plan: Plan, name: str) -> dict[str, Any]:
    """Variant ``name``'s data from its job's ``stats.json``: documents read and kept, tokens, each stage's
    documents in and out, and the epochs the budget makes of its tokens."""
    path = plan.layout.data(name) / "stats.json"
    stats = json.loads(path.read_text()) if path.exists() else {}
    stages = [{"stage": s.get("stage"), "docs_in": s.get("docs_in"), "docs_out": s.get("docs_out"),
               "dropped": s.get("dropped") or {}} for s in stats.get("stages") or [] if s.get("stage") != "90-tokenize"]
    output = stats.get("output") or {}
    tokens = output.get("tokens")
    return {"read": stages[0]["docs_in"] if stages else None, "kept": stages[-1]["docs_out"] if stages else None,
            "tokens": tokens,
            "stages": stages, "epochs": plan.spec.budget.tokens / tokens if tokens else None}


def collect(plan: Plan) -> dict[str, Any]:
    """The whole of ablation.json."""
    variants: dict[str, Any] = {}
    for name in plan.spec.variants:
        runs = {str(seed): run_result(plan, Run(name, seed)) for seed in plan.spec.seeds}
        done = [r for r in runs.values() if r is not None]
        names = sorted({k for r in done for k in r["scores"]})
        variants[name] = {"data": funnel(plan, name), "runs": runs,
                          "scores": {k: summary([r["scores"][k] for r in done if k in r["scores"]]) for k in names}}
    return {"name": plan.spec.name, "budget_tokens": plan.spec.budget.tokens, "tokens_per_step": plan.tokens_per_step,
            "max_steps": plan.max_steps, "seq_len": plan.seq_len, "seeds": plan.spec.seeds,
            "proxy": plan.spec.proxy.model_dump(), "variants": variants, "gaps": gaps(variants),
            "complete": all(r is not None for v in variants.values() for r in v["runs"].values())}


def gaps(variants: dict[str, Any]) -> dict[str, dict[str, float]]:
    """For every ordered pair ``A-B`` of variants and every score both have: mean(A) - mean(B), and that gap over
    the larger of the two seed spreads (``over_spread``; None when both spreads are 0)."""
    out: dict[str, dict[str, float]] = {}
    names = list(variants)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pair: dict[str, Any] = {}
            for key, sa in variants[a]["scores"].items():
                sb = variants[b]["scores"].get(key)
                if sa is None or sb is None:
                    continue
                gap, spread = sa["mean"] - sb["mean"], max(sa["spread"], sb["spread"])
                pair[key] = {"gap": gap, "over_spread": abs(gap) / spread if spread > 0 else None}
            out[f"{a}-{b}"] = pair
    return out


def write(plan: Plan) -> dict[str, Any]:
    data = collect(plan)
    tmp = plan.layout.out / "ablation.json.tmp"
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(plan.layout.out / "ablation.json")
    return data
