"""``OUT/REPORT.md`` in the dataset card's style: the proxy recipe, final bits per byte with the seed spread, the
task table, a loss-curve figure per variant and the data funnel of every variant side by side, from
ablation.json. Figures are drawn with the card's settings (:mod:`pipeline.card.figures`) into ``OUT/figures/``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

from pipeline.card.figures import DROPPED, KEPT, RC, _figure, render
from pipeline.card.markdown import table
from service.ablation.plan import Plan

FIGURES = "figures"
COLORS = (KEPT, DROPPED, "#4a9d5b", "#8a5bd8", "#c9a227", "#555555")


def loss_figure(name: str, runs: dict[str, Any]) -> Any:
    """Training loss against step, one line per seed (and validation loss dashed where the trainer logged it)."""
    with matplotlib.rc_context(RC):
        fig = _figure(3.2)
        fig.subplots_adjust(left=0.1, right=0.97, top=0.9, bottom=0.15)
        ax = fig.add_subplot()
        for i, (seed, run) in enumerate(sorted(runs.items())):
            points = (run or {}).get("curve") or []
            color = COLORS[i % len(COLORS)]
            ax.plot([p["step"] for p in points if "loss" in p], [p["loss"] for p in points if "loss" in p],
                    color=color, linewidth=1, label=f"seed {seed}")
            val = [p for p in points if "val_loss" in p]
            if val:
                ax.plot([p["step"] for p in val], [p["val_loss"] for p in val], color=color, linestyle="--",
                        linewidth=1, label=f"seed {seed} validation")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title(f"{name}: loss")
        ax.legend(fontsize=7)
    return fig


def bpb_figure(rows: Sequence[tuple[str, float, float, float]], score: str) -> Any:
    """Mean ``score`` per variant with its seed range (min to max) as the error bar."""
    with matplotlib.rc_context(RC):
        fig = _figure(1.2 + 0.4 * len(rows))
        fig.subplots_adjust(left=0.2, right=0.95, top=0.8, bottom=0.3)
        ax = fig.add_subplot()
        pos = list(range(len(rows)))[::-1]
        means = [r[1] for r in rows]
        err = [[r[1] - r[2] for r in rows], [r[3] - r[1] for r in rows]]
        ax.barh(pos, means, xerr=err, color=KEPT, capsize=4)
        ax.set_yticks(pos, [r[0] for r in rows])
        low = min(r[2] for r in rows)
        ax.set_xlim(low * 0.95, max(r[3] for r in rows) * 1.02)
        ax.set_xlabel("bits per byte (lower is better; the line: seed range, min to max)")
        ax.set_title(score)
    return fig


def write_report(plan: Plan, data: dict[str, Any]) -> Path:
    folder = plan.layout.out / FIGURES
    folder.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    for name, variant in data["variants"].items():
        names.append(_save(folder, f"loss-{name}", loss_figure(name, variant["runs"])))
    keys = sorted({k for v in data["variants"].values() for k in v["scores"] if k == "common" or
                   k.startswith("common.")})
    for key in keys:  # the common set, and each of its parts by validation.by
        rows = [(n, s["mean"], s["min"], s["max"]) for n, v in data["variants"].items()
                for s in [v["scores"].get(key)] if s]
        names.append(_save(folder, f"bpb-{key}", bpb_figure(rows, key)))
    path = plan.layout.out / "REPORT.md"
    path.write_text(markdown(plan, data, names) + "\n")
    return path


def _save(folder: Path, name: str, fig: Any) -> str:
    svg, png = render(fig)
    (folder / f"{name}.svg").write_bytes(svg)
    (folder / f"{name}.png").write_bytes(png)
    return name


def markdown(plan: Plan, data: dict[str, Any], figures: Sequence[str]) -> str:
    spec = plan.spec
    parts = [f"# Ablation: {spec.name}", "",
             "Written by `tokenmill ablate` from `ablation.json`. Every variant read the same raw documents (the "
             "common validation set held out before any filter), used one tokenizer and trained "
             f"{data['max_steps']:,} steps of {data['tokens_per_step']:,} tokens (budget {spec.budget.tokens:,}) "
             f"with `{Path(spec.proxy.config).name}`, seeds {', '.join(map(str, spec.seeds))}.", ""]
    if not data["complete"]:
        parts += ["**Incomplete**: some runs have not finished; rerun `tokenmill ablate` to continue.", ""]
    parts += ["## Scores", "", "Mean over seeds and the seed spread (max - min); bits per byte: lower is better; "
              "`common`: the common validation set, `common.VALUE`: its part by `validation.by`, `own`: each "
              "variant's own validation split (not comparable across variants: each chose its own).", "",
              _scores_table(data), ""]
    parts += [f"![{f}]({FIGURES}/{f}.svg)  \n([PNG]({FIGURES}/{f}.png))" for f in figures if f.startswith("bpb")]
    parts += ["", "## Gaps", "", _gaps_table(data), "", "## Loss curves", ""]
    parts += [f"![{f}]({FIGURES}/{f}.svg)  \n([PNG]({FIGURES}/{f}.png))\n" for f in figures if f.startswith("loss")]
    parts += ["## Data funnel", "", _funnel_table(data)]
    return "\n".join(parts)


def _scores_table(data: dict[str, Any]) -> str:
    keys = sorted({k for v in data["variants"].values() for k in v["scores"]}, key=lambda k: (k != "common", k))
    rows = [[name, *[_cell(v["scores"].get(k)) for k in keys]] for name, v in data["variants"].items()]
    return table(["variant", *keys], rows)


def _cell(s: dict[str, float] | None) -> str:
    return "-" if not s else f"{s['mean']:.4f} (spread {s['spread']:.4f})" if s["n"] > 1 else f"{s['mean']:.4f}"


def _gaps_table(data: dict[str, Any]) -> str:
    rows = [[pair, key, f"{g['gap']:+.4f}", "-" if g["over_spread"] is None else f"{g['over_spread']:.1f}"]
            for pair, scores in data["gaps"].items() for key, g in sorted(scores.items())]
    return table(["variants (A-B)", "score", "mean A - mean B", "|gap| / seed spread"], rows) if rows else "-"


def _funnel_table(data: dict[str, Any]) -> str:
    rows = []
    for name, v in data["variants"].items():
        d = v["data"]
        stages = "; ".join(f"{s['stage']}: {s['docs_in']:,} → {s['docs_out']:,}" for s in d["stages"]
                           if s.get("docs_in") is not None and s.get("docs_out") is not None)
        rows.append([name, _num(d["read"]), _num(d["kept"]), _num(d["tokens"]),
                     "-" if d["epochs"] is None else f"{d['epochs']:.2f}", stages or "-"])
    return table(["variant", "documents read", "kept", "tokens", "epochs of the budget", "stages (in → out)"], rows)


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:,}"
