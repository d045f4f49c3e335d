"""The card's text (the output's ``README.md``): YAML front matter in the Hugging Face dataset-card format, then
the sections.

The front matter's ``configs`` name the files ``datasets.load_dataset(OUT)`` reads: the documents (``documents/``)
when the job published them, else the token shards (one config per ``output.split_by`` group). Without them
``datasets`` would read every file of the folder (``stats.json``, ``rejected/``...) as one table and fail. The
shards are not a second config beside the documents: ``datasets`` picks one builder for all of a folder's configs
from the first one's files, so a WebDataset config next to a Parquet one is read as Parquet; the card says how to
load them from ``shards/`` instead. ``language`` lists the kept documents' languages (:mod:`.languages`); what
the ``lid`` stage saw is a table in the text.

Every value shown from data or from a spec (a job's name, language codes, source paths, drop reasons, stage
parameters, benchmark items) goes through :func:`escape`: a record whose ``lang`` is ``<script>...`` is text
in the card, never markup a renderer (the Hub, GitHub, any CommonMark one) would run or follow. The front matter
holds the values as YAML data; the spec's YAML is a fenced block no value can close (:func:`fenced`).
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from pipeline.card.collect import CARD_DIR, SPEC, CardData

#: the Hub's size categories, by kept documents
SIZES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
         (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"), (1_000_000_000, "100M<n<1B"))
_ISO = re.compile(r"^[a-z]{2,3}(_[A-Z][a-z]{3})?$")
#: what Markdown reads as markup inside a line: backslash-escaped (``_`` between two letters or digits cannot
#: start or end emphasis, so ``EMAIL_ADDRESS`` stays as written); ``<``, ``>``, ``&`` and quotes become HTML
#: entities, which every Markdown renderer and HTML read as text
_MARKUP = re.compile(r"[\\`*\[\]#|~]|_(?!(?<=[^\W_]_)[^\W_])")
_LINE_BREAKS = re.compile(r"[\r\n]+")


def size_category(n: int) -> str:
    return next((label for bound, label in SIZES if n < bound), "n>1T" if n >= 10 ** 12 else "1B<n<10B")


def front_matter(d: CardData) -> dict[str, Any]:
    meta: dict[str, Any] = {"pretty_name": d.name}
    langs = [code for code in d.kept_languages or [] if _ISO.match(code)]
    if langs:
        meta["language"] = langs
    meta["size_categories"] = [size_category(d.kept_docs)]
    meta["task_categories"] = ["text-generation"]
    configs = dataset_configs(d)
    if configs:
        meta["configs"] = configs
    own: dict[str, Any] = {"spec_hash": (d.manifest or {}).get("spec_hash"),
                           "tokenizer_hash": (d.manifest or {}).get("tokenizer_hash"), "versions": d.versions,
                           "inputs": [{k: i.get(k) for k in ("path", "format", "files", "bytes", "sha256")}
                                      for i in d.stats.get("inputs") or []]}
    meta["tokenmill"] = {k: v for k, v in own.items() if v not in (None, [])}
    return meta


def documents_glob(d: CardData) -> str | None:
    if d.documents is None:
        return None
    return f"documents/*.{'parquet' if d.documents.get('documents') == 'parquet' else 'jsonl'}"


def shard_folders(d: CardData) -> list[str]:
    """Where the token shards are: ``shards/``, or ``<group>/shards/`` per ``output.split_by`` group."""
    groups = d.stats.get("groups") or {}
    if groups:
        return [f"{g}/shards" for g in sorted(groups)]
    return ["shards"] if int((d.stats.get("output") or {}).get("shards", 0) or 0) else []


def dataset_configs(d: CardData) -> list[dict[str, Any]]:
    """The ``configs`` of the front matter: the documents, else the token shards (WebDataset ``.tar``)."""
    docs = documents_glob(d)
    if docs is not None:
        return [{"config_name": "default", "data_files": [{"split": "train", "path": docs}]}]
    folders = shard_folders(d)
    names = ["default"] if folders == ["shards"] else [f.split("/", 1)[0] for f in folders]
    return [{"config_name": name, "data_files": [{"split": "train", "path": f"{folder}/*.tar"}]}
            | ({"default": True} if i == 0 and name != "default" else {})
            for i, (name, folder) in enumerate(zip(names, folders, strict=True))]


def escape(value: Any) -> str:
    """``value`` as Markdown text that renders as itself, on one line (a table cell's ``|`` escaped too); an
    ``int`` with thousands separators."""
    text = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
    return html.escape(_MARKUP.sub(r"\\\g<0>", _LINE_BREAKS.sub(" ", text)))


def table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(escape(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(escape(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def fenced(text: str, info: str) -> str:
    """``text`` as a fenced code block whose fence is longer than any run of backticks in it: none can end it."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return f"{fence}{info}\n{text}\n{fence}"


def figure(name: str, alt: str) -> str:
    return f"![{alt}]({CARD_DIR}/{name}.svg)  \n([PNG]({CARD_DIR}/{name}.png))"


def render(d: CardData, figures: Sequence[str], extra: Sequence[str] = ()) -> str:
    """The whole card; ``figures`` are the names written into ``card/``, ``extra`` more sections (a comparison)."""
    out = ["---", yaml.safe_dump(front_matter(d), sort_keys=False, allow_unicode=True).rstrip(), "---", "",
           f"# {escape(d.name)}", "", "Written by tokenmill from what the job recorded (`stats.json`, `manifest.json`, "
           "`card/spec.yaml`, a sample of `rejected/`). `tokenmill card OUT` rebuilds it.", ""]
    for section in (_loading, _sources, _pipeline, _funnel, _languages, _lengths, _tokens, _validation, _pii,
                    _contamination, _tokenizer, _redacted):
        text = section(d, figures)
        if text:
            out += [text, ""]
    out += list(extra)
    out += [_rebuild(d), ""]
    return "\n".join(out)


def _loading(d: CardData, figs: Sequence[str]) -> str:
    """How to read the output with ``datasets`` (``OUT``: this folder, or ``hf://datasets/<repo>`` once pushed)."""
    docs, shards = documents_glob(d), shard_folders(d)
    if docs is None and not shards:
        return ""
    code = ["import datasets", ""]
    if docs is not None:
        code.append(f'documents = datasets.load_dataset("OUT", split="train")  # {docs}')
    if docs is None and shards == ["shards"]:
        code.append('tokens = datasets.load_dataset("OUT", split="train")  # shards/*.tar')
    elif docs is None:
        code.append(f'tokens = datasets.load_dataset("OUT", "{shards[0].split("/", 1)[0]}", split="train")'
                    "  # a group's shards")
    else:
        code += [f'tokens = datasets.load_dataset("webdataset", data_files="OUT/{f}/*.tar", split="train")'
                 for f in shards]
    text = ["## Loading", "", "With `datasets`; `OUT` is this folder's path (once pushed to the Hub: `<user>/<name>`, "
            "and the shards' `hf://datasets/<user>/<name>/...`):",
            "", fenced("\n".join(code), "python")]
    if shards:
        text += ["", "A row of the token shards is one packed sequence: `input_ids.npy` (token ids of "
                 "`tokenizer.json`), `doc_lens.npy` (the documents' lengths in it), `meta.json` (their ids and "
                 "`ord`s) and, for an input with a chat template, `loss_mask.npy` (0 on prompt tokens)."]
    if docs is not None and shards:
        text += ["", "The shards are no second config of this card: `datasets` reads every config of a folder "
                 "with the builder of the first one's files (Parquet or JSON here), so they are loaded by the "
                 "`webdataset` builder, by path."]
    return "\n".join(text)


def _sources(d: CardData, figs: Sequence[str]) -> str:
    inputs = d.stats.get("inputs") or []
    srcs = (d.profile or {}).get("sources") or {}
    rows = [[i.get("path"), i.get("format"), i.get("files"), i.get("bytes"), srcs.get(str(n), {}).get("docs", "-"),
             srcs.get(str(n), {}).get("tokens", "-")] for n, i in enumerate(inputs)]
    body = table(["input", "format", "files", "bytes", "documents kept", "tokens"], rows) if rows else \
        "The job recorded no per-input figures (an output written before tokenmill recorded them)."
    return "\n".join(["## Sources", "", body] + (["", figure("sources", "tokens per source")]
                                                   if "sources" in figs else []))


def _pipeline(d: CardData, figs: Sequence[str]) -> str:
    if d.spec is None:
        return "## Pipeline\n\nStages: " + ", ".join(escape(s["stage"]) for s in d.stages)
    def params(s: dict[str, Any]) -> str:
        return yaml.safe_dump(s.get("params") or {}, default_flow_style=True, width=10 ** 6).strip()
    rows = [[i + 1, s.get("type"), params(s)] for i, s in enumerate(d.spec.get("stages") or [])]
    return "\n".join(["## Pipeline", "", table(["#", "stage", "parameters"], rows)])


def _funnel(d: CardData, figs: Sequence[str]) -> str:
    rows = [[s["stage"], s["docs_in"], s["docs_out"],
             ", ".join(f"{k}: {v:,}" for k, v in (s.get("dropped") or {}).items()) or "-"] for s in d.stages]
    reasons = d.drop_reasons()
    parts = ["## Funnel", "", table(["stage", "documents in", "documents out", "dropped (reason: documents)"], rows)]
    if "funnel" in figs:
        parts += ["", figure("funnel", "documents through the stages")]
    if reasons:
        parts += ["", "Drop reasons, every stage and rule (`(annotated)`: would be dropped; annotate mode kept it):",
                  "",
                  table(["reason", "documents"], list(reasons.items()))]
        if "drops" in figs:
            parts += ["", figure("drops", "drop reasons per rule")]
    return "\n".join(parts)


def _languages(d: CardData, figs: Sequence[str]) -> str:
    langs, kept_langs = d.languages, d.kept_languages
    if not langs and not kept_langs:
        return ""
    parts = ["## Languages", ""]
    if kept_langs is not None:
        parts += ["The kept documents' `meta.lang` (the front matter's `language`): "
                  + (", ".join(escape(c) for c in kept_langs) or "none") + ".", ""]
    if langs:
        total = sum(langs.values()) or 1
        kept = (d.profile or {}).get("languages") or {}
        rows = [[code, n, f"{100 * n / total:.1f} %", kept.get(code, {}).get("docs", "-")]
                for code, n in sorted(langs.items(), key=lambda kv: (-kv[1], kv[0]))]
        parts += ["What the `lid` stage saw, every document it read (a language filter drops some); kept: in the "
                  "output.", "", table(["language", "documents (lid)", "share", "kept"], rows)]
    return "\n".join(parts + (["", figure("languages", "language shares")] if "languages" in figs else []))


def _lengths(d: CardData, figs: Sequence[str]) -> str:
    if "lengths" not in figs:
        return ""
    return "\n".join(["## Document lengths", "", f"Kept: every document in the output; dropped: a sample of "
                      f"{d.dropped.docs:,} records of `rejected/` (the first of each stage's files), tokens by the "
                      "job's tokenizer.", "", figure("lengths", "document lengths, kept and dropped")])


def _tokens(d: CardData, figs: Sequence[str]) -> str:
    out, packing = d.stats.get("output") or {}, d.stats.get("packing")
    if not packing:
        return ""
    rows = [["shards", out.get("shards")], ["samples (packed sequences)", out.get("samples")],
            ["tokens", out.get("tokens")], ["seq_len", packing.get("seq_len")], ["method", packing.get("method")],
            ["utilization", f"{100 * float(packing.get('utilization', 0)):.2f} %"],
            ["documents cut at a sequence end", packing.get("docs_cut")]]
    return "\n".join(["## Tokens and packing", "", table(["", ""], rows)])


def _validation(d: CardData, figs: Sequence[str]) -> str:
    """``output.validation``: the held-out split's size and what keeping near duplicates out of training cost."""
    v = d.stats.get("validation")
    if not isinstance(v, dict):
        return ""
    how = ("id; the job's near_dedup stage left one document per near-duplicate cluster, so clusters stay on one "
           "side") if v.get("key") == "id" else (
        f"MinHash-LSH key (near_dedup's kernel); {int(v.get('dropped_near_validation', 0)):,} documents sharing an "
        "LSH band with a held-out one were left out of training, so near duplicates stay on one side")
    return "\n".join(["## Validation split", "", (
        f"`{escape(v.get('path'))}/`: {int(v.get('documents', 0)):,} documents held out of training, "
        f"{int(v.get('samples', 0)):,} samples and {int(v.get('tokens', 0)):,} tokens, a shard set of its own with "
        f"this tokenizer (its texts in `{escape(v.get('path'))}/documents.jsonl`). Chosen by a hash of each "
        f"document's {how}.")])


def _pii(d: CardData, figs: Sequence[str]) -> str:
    found = d.counters("pii", "entity:")
    if d.stage("pii") is None:
        return ""
    params = next((s.get("params") or {} for s in (d.spec or {}).get("stages") or [] if s.get("type") == "pii"), {})
    mode, actions = params.get("mode", "redact"), params.get("actions") or {}
    rows = [[t, n, "annotated (kept)" if mode == "annotate" else actions.get(t, "placeholder")]
            for t, n in found.items()]
    body = table(["type", "entities", "action"], rows) if rows else "No entity found."
    return "\n".join(["## PII", "", body])


def _contamination(d: CardData, figs: Sequence[str]) -> str:
    if d.stage("decontaminate") is None:
        return ""
    docs = d.counters("decontaminate", "docs:")
    rules, items = d.counters("decontaminate", "rule:"), d.counters("decontaminate", "item:")
    rows = []
    for bench, n in docs.items():
        by_rule = ", ".join(f"{r.split(':', 1)[1]}: {v}" for r, v in rules.items() if r.split(":", 1)[0] == bench)
        found = sorted(k.split(":", 1)[1] for k in items if k.split(":", 1)[0] == bench)
        shown = ", ".join(found[:10]) + (f" (+{len(found) - 10})" if len(found) > 10 else "")
        rows.append([bench, n, d.counters("decontaminate", "exact_docs:").get(bench, 0), by_rule or "-",
                     len(found), shown or "-"])
    body = table(["benchmark", "documents", "exact", "matches per rule", "items found", "items"], rows) if rows \
        else "No benchmark item found in the corpus."
    return "\n".join(["## Benchmark contamination", "", body])


def _tokenizer(d: CardData, figs: Sequence[str]) -> str:
    if d.manifest is None and d.vocab_size is None:
        return ""
    langs: Mapping[str, Mapping[str, int]] = (d.profile or {}).get("languages") or {}
    rows = [[code, r["sample_docs"], f"{r['sample_bytes'] / r['sample_tokens']:.2f}",
             f"{r['sample_words'] / r['sample_tokens']:.3f}"] for code, r in langs.items() if r.get("sample_tokens")]
    every = (d.profile or {}).get("sample_every", 8)
    vocab = f"{d.vocab_size:,}" if d.vocab_size else "?"
    sha = escape((d.manifest or {}).get("tokenizer_hash"))
    parts = ["## Tokenizer", "", f"Vocabulary: {vocab} tokens; sha256 {sha}."]
    if rows:
        parts += ["", f"Efficiency on a sample of the kept documents (one in {every}, by position; words split at "
                  "whitespace):", "", table(["language", "documents", "bytes / token", "words / token"], rows)]
    return "\n".join(parts)


def _redacted(d: CardData, figs: Sequence[str]) -> str:
    if not d.redacted:
        return ""
    rows = [[e.get("field", "?"), e.get("now", "?"), e.get("sha256", "-")] for e in d.redacted]
    return "\n".join(["## Paths", "", f"No local path of the machine that ran the job is shown here or in "
                      f"`{CARD_DIR}/{SPEC}`. Each one is written relative to the deepest folder they all share (a "
                      "copy of the spec put in that folder reads the same files), or as its name alone where they "
                      "share none; the fingerprint is a sha256 prefix (of a file's bytes; of an input's, a folder's "
                      "or a pattern's files' names and sizes):", "",
                      table(["field", "written as", "sha256"], rows)])


def _rebuild(d: CardData) -> str:
    if d.spec is None:
        return "## Rebuild\n\nThis output predates `card/spec.yaml`: its spec was not recorded."
    return "\n".join(["## Rebuild", "", f"The spec is `{CARD_DIR}/{SPEC}` (secrets redacted; `output.path` is "
                      "`rebuilt`, relative to that folder; local paths as \"Paths\" says):", "",
                      fenced(yaml.safe_dump(d.spec, sort_keys=False, allow_unicode=True).rstrip(), "yaml"), "",
                      fenced(f"tokenmill run {CARD_DIR}/{SPEC}", "bash")])
