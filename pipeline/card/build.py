"""Build a card: collect the facts, draw the figures, write ``README.md`` and ``card/`` into the folder.

The job calls :func:`write_card` on its stage folder before the commit (so the card is published with the
output, in the same commit); ``tokenmill card OUT`` calls it on a finished output. ``compare``: earlier outputs,
oldest first; the last is the one the card is compared with, and every one is a bar of the versions figure.
The spec and the card show no local path (:mod:`pipeline.card.paths`); a ``CARD.md`` of an output carded before
the card was its README is removed, so an output has one card.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pipeline import storage
from pipeline.card import figures
from pipeline.card.collect import CARD, CARD_DIR, OLD_CARD, SPEC, CardData, TokenCounter, collect, spec_for_card
from pipeline.card.compare import compare_section, history_rows
from pipeline.card.languages import kept_languages
from pipeline.card.markdown import render
from pipeline.card.paths import REDACTED, Redactor, local_paths, merge, shared_root

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
    """Write ``README.md`` and ``card/*`` into ``folder`` (``spec_json``: the job's spec, written as
    ``card/spec.yaml``; else the one there is kept); returns the names written, relative to ``folder``.
    ``count_tokens``: how this output's dropped sample is tokenized (:func:`pipeline.card.collect.collect`)."""
    d = collect(folder, count_tokens)
    d.kept_languages = kept_languages(folder, d.stats, d.documents)
    names = _without_local_paths(folder, d, spec_json)
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
    if storage.exists(storage.join(folder, OLD_CARD)):
        storage.delete_file(storage.join(folder, OLD_CARD))
    return [CARD, *names]


def _without_local_paths(folder: str, d: CardData, spec_json: dict[str, object] | None) -> list[str]:
    """Rewrite the local paths of ``d`` (its spec, its inputs: :mod:`pipeline.card.paths`) and write
    ``card/spec.yaml`` and ``card/redacted.json``; returns the names written."""
    import yaml

    inputs = d.stats.get("inputs") or []
    spec = spec_for_card(dict(spec_json)) if spec_json is not None else d.spec
    root = shared_root(local_paths(spec) + local_paths([i.get("path") for i in inputs]))
    redactor = Redactor(root, {str(i["path"]): str(i["sha256"]) for i in inputs if i.get("path") and i.get("sha256")})
    names: list[str] = []
    if spec is not None:
        d.spec = redactor.spec(spec)
        text = yaml.safe_dump(d.spec, sort_keys=False, allow_unicode=True)
        storage.write_text(storage.join(folder, CARD_DIR, SPEC), text)
        names.append(f"{CARD_DIR}/{SPEC}")
    # stats.json's inputs are the spec's: the same field names (an older output without its spec: these alone)
    d.stats["inputs"] = [dict(i, path=redactor.path(str(i["path"]), f"inputs[{n}].path")) if i.get("path") else i
                         for n, i in enumerate(inputs)]
    path = storage.join(folder, CARD_DIR, REDACTED)
    earlier = json.loads(storage.read_text(path)) if storage.exists(path) else []
    earlier = [e for e in earlier if isinstance(e, dict) and all(isinstance(v, str) for v in e.values())] \
        if isinstance(earlier, list) else []  # a file edited by hand: what is not an entry is left out
    d.redacted = merge(earlier, redactor.found)
    if d.redacted:
        storage.write_text(path, json.dumps(d.redacted, indent=1) + "\n")
        names.append(f"{CARD_DIR}/{REDACTED}")
    return names
