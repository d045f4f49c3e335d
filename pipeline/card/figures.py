"""The card's figures with matplotlib (Agg, no display, no pyplot state): SVG and PNG, byte for byte the same
for the same data.

Deterministic: text is drawn as paths in matplotlib's bundled DejaVu Sans (no font lookup on the machine),
SVG ids come from a fixed salt, and neither file carries a date or a software name.
"""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET  # our own matplotlib output, not untrusted XML
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import matplotlib
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

#: every figure's settings: fixed font, fixed SVG ids, text as paths
RC: dict[RcKeyType, Any] = {"font.family": "DejaVu Sans", "font.size": 9, "svg.hashsalt": "tokenmill-card",
                      "svg.fonttype": "path", "figure.dpi": 100, "savefig.dpi": 100,
                      "axes.spines.top": False, "axes.spines.right": False}
KEPT, DROPPED = "#3b7dd8", "#d8613b"
SVG_NS = "http://www.w3.org/2000/svg"


def render(fig: Figure) -> tuple[bytes, bytes]:
    """The figure as (SVG, PNG) bytes."""
    svg, png = io.BytesIO(), io.BytesIO()
    with matplotlib.rc_context(RC):
        fig.savefig(png, format="png", metadata={"Software": None})
        fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
    return without_inline_style(svg.getvalue()), png.getvalue()


def without_inline_style(svg: bytes) -> bytes:
    """matplotlib's SVG with every ``style="k: v"`` turned into presentation attributes (``k="v"``) and its
    ``<style>`` element dropped: a page whose Content-Security-Policy admits no inline style (the dashboard's)
    draws it as it is meant to look."""
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", "http://www.w3.org/1999/xlink")
    root = ET.fromstring(svg)
    for parent in list(root.iter()):
        for child in list(parent):
            if child.tag == f"{{{SVG_NS}}}style":
                parent.remove(child)
        for decl in (parent.attrib.pop("style", None) or "").split(";"):
            key, sep, value = decl.partition(":")
            if sep and key.strip():
                parent.set(key.strip(), value.strip())
    return b'<?xml version="1.0" encoding="utf-8" standalone="no"?>\n' + ET.tostring(root, encoding="utf-8")


def _figure(height: float, width: float = 7.0) -> Figure:
    """Margins set by hand (a layout engine measuring every label took half the card's time)."""
    with matplotlib.rc_context(RC):
        return Figure(figsize=(width, height))


def _barh(title: str, labels: Sequence[str], values: Sequence[float], xlabel: str, color: str = KEPT) -> Figure:
    with matplotlib.rc_context(RC):
        height = 1.2 + 0.28 * len(labels)
        fig = _figure(height)
        longest = max((len(str(label)) for label in labels), default=1)
        fig.subplots_adjust(left=min(0.6, 0.04 + 0.0105 * longest), right=0.97, top=1 - 0.35 / height,
                            bottom=0.55 / height)
        ax = fig.add_subplot()
        pos = list(range(len(labels)))[::-1]
        ax.barh(pos, values, color=color)
        ax.set_yticks(pos, labels)
        for p, v in zip(pos, values, strict=True):
            ax.annotate(f"{v:,.0f}", (v, p), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.margins(x=0.15)
    return fig


def funnel(rows: Sequence[tuple[str, int]]) -> Figure:
    """Documents left after each stage (``read`` first: the documents the readers produced)."""
    return _barh("Documents through the stages", [r[0] for r in rows], [r[1] for r in rows], "documents")


def drop_reasons(reasons: Mapping[str, int], top: int = 20) -> Figure:
    items = list(reasons.items())[:top]
    return _barh("Drop reasons (stage:rule)", [k for k, _ in items], [v for _, v in items], "documents", DROPPED)


def languages(shares: Mapping[str, int]) -> Figure:
    total = sum(shares.values()) or 1
    items = sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))[:20]
    return _barh("Language shares (lid)", [k for k, _ in items], [100.0 * v / total for _, v in items],
                 "% of documents")


def sources(rows: Sequence[tuple[str, int]]) -> Figure:
    return _barh("Tokens per source", [r[0] for r in rows], [r[1] for r in rows], "tokens")


def lengths(kept: Mapping[str, Mapping[str, int]], dropped: Mapping[str, Mapping[int, int]], dropped_label: str
            ) -> Figure:
    """Log2 histograms of characters and tokens per document, kept against dropped (a sample)."""
    with matplotlib.rc_context(RC):
        fig = _figure(3.0, 8.0)
        fig.subplots_adjust(left=0.08, right=0.98, top=0.9, bottom=0.3, wspace=0.25)
        for i, unit in enumerate(("chars", "tokens")):
            ax = fig.add_subplot(1, 2, i + 1)
            k = {int(b): int(n) for b, n in (kept.get(unit) or {}).items()}
            d = dict(dropped.get(unit) or {})
            bins = sorted(set(k) | set(d)) or [0]
            lo, hi = bins[0], bins[-1]
            xs = list(range(lo, hi + 1))
            if d:  # side by side; kept alone when nothing was dropped
                ax.bar([x - 0.2 for x in xs], [k.get(x, 0) for x in xs], width=0.4, color=KEPT, label="kept")
                ax.bar([x + 0.2 for x in xs], [d.get(x, 0) for x in xs], width=0.4, color=DROPPED, label=dropped_label)
            else:
                ax.bar(xs, [k.get(x, 0) for x in xs], width=0.6, color=KEPT, label="kept")
            ax.set_xticks(xs, [f"{2 ** x:,}" if x < 20 else f"2^{x}" for x in xs], rotation=60, fontsize=7)
            ax.set_xlabel(f"{unit} per document (from, log2 bins)")
            ax.set_ylabel("documents")
            ax.set_title(f"Document length: {unit}")
            ax.legend(fontsize=7)
    return fig


def versions(rows: Sequence[tuple[str, int, int]]) -> Figure:
    """Documents and tokens of each version, this one last."""
    with matplotlib.rc_context(RC):
        fig = _figure(2.8, 8.0)
        fig.subplots_adjust(left=0.1, right=0.98, top=0.88, bottom=0.3, wspace=0.3)
        names = [r[0] for r in rows]
        for i, (what, col) in enumerate((("documents", 1), ("tokens", 2))):
            ax = fig.add_subplot(1, 2, i + 1)
            colors = [KEPT] * (len(rows) - 1) + [DROPPED]
            ax.bar(names, [r[col] for r in rows], color=colors)
            ax.set_title(f"{what.capitalize()} per version")
            ax.tick_params(axis="x", labelrotation=45)
    return fig
