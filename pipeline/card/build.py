"""Build a card: collect the facts, draw the figures, write ``CARD.md`` and ``card/`` into the folder.

The job calls :func:`write_card` on its stage folder before the commit (so the card is published with the
output, in the same commit); ``tokenmill card OUT`` calls it on a finished output. ``compare``: earlier outputs,
oldest first; the last is the one the card is compared with, and every one is a bar of the versions figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pipeline import storage
from pipeline.card import figures
from pipeline.card.collect import CARD, CARD_DIR, SPEC, CardData, TokenCounter, collect
from pipeline.card.compare import compare_section, history_rows
from pipeline.card.markdown import render

if TYPE_CHECKING:
    from matplotlib.figure import Figure

def card_figures(d: CardData, history: list[tuple[str, CardData]]) -> dict[str, Figure]:
    """The figures this output has data for, by file stem."""
    out: dict[str, Figure] = {}
    read = d.stages[0]["docs_in"] if d.stages else 0
    rows = [("records in", int(read))]
    rows += [(s["stage"], int(s["docs_out"])) for s in d.stages if s["stage"] != "90-tokenize"]
    out["funnel"] = figures.funnel(rows)
    reasons = d.drop_reasons()
    if reasons:
        out["drops"] = figures.drop_reasons(reasons)
    if d.languages:
        out["languages"] = figures.languages(d.languages)
    profile = d.profile or {}
    inputs = d.stats.get("inputs") or []
    if profile.get("sources"):
        names = [str(i.get("path", n)).rsplit("/", 1)[-1] for n, i in enumerate(inputs)]
        out["sources"] = figures.sources([(names[int(k)] if int(k) < len(names) else k, int(v["tokens"]))
                                          for k, v in profile["sources"].items()])
    if profile.get("chars") or d.dropped.docs:
        out["lengths"] = figures.lengths(profile, {"chars": d.dropped.chars, "tokens": d.dropped.tokens},
                                         f"dropped (sample of {d.dropped.docs:,})")
    if history:
        out["versions"] = figures.versions(history_rows(history, d, "this"))
    return out


def write_card(folder: str, compare: Sequence[str] = (), spec_json: dict[str, object] | None = None,
               count_tokens: TokenCounter | None = None) -> list[str]:
    """Write ``CARD.md`` and ``card/*`` into ``folder`` (``spec_json``: the job's spec, written as ``card/spec.yaml``
    first); returns the names written, relative to ``folder``. ``count_tokens``: how this output's dropped sample is
    tokenized (:func:`pipeline.card.collect.collect`)."""
    import yaml

    from pipeline.card.collect import spec_for_card

    names: list[str] = []
    if spec_json is not None:
        text = yaml.safe_dump(spec_for_card(dict(spec_json)), sort_keys=False, allow_unicode=True)
        storage.write_text(storage.join(folder, CARD_DIR, SPEC), text)
        names.append(f"{CARD_DIR}/{SPEC}")
    d = collect(folder, count_tokens)
    # an earlier output that is gone (a version folder removed by hand) is left out, not a reason for no card
    history = [(p, collect(p)) for p in compare if storage.exists(storage.join(p, "stats.json"))]
    figs = card_figures(d, history)
    for stem, fig in figs.items():
        svg, png = figures.render(fig)
        storage.write_bytes(storage.join(folder, CARD_DIR, f"{stem}.svg"), svg)
        storage.write_bytes(storage.join(folder, CARD_DIR, f"{stem}.png"), png)
        names += [f"{CARD_DIR}/{stem}.svg", f"{CARD_DIR}/{stem}.png"]
    extra = [compare_section(d, history[-1][1], history[-1][0]), ""] if history else []
    if "versions" in figs:
        extra += [f"![documents and tokens per version]({CARD_DIR}/versions.svg)", ""]
    storage.write_text(storage.join(folder, CARD), render(d, list(figs), extra))
    return [CARD, *names]
