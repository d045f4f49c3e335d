"""The facts a card shows, read from an output folder (or a job's stage folder before its commit).

Only what the job records: ``stats.json`` (stage counts and counters, ``inputs``, ``profile``), ``manifest.json``,
``documents.json``, ``tokenizer.json``, ``card/spec.yaml`` and a bounded, deterministic sample of ``rejected/``
(files in name order, at most :data:`SAMPLE_PER_STAGE` records and :data:`SAMPLE_BYTES` bytes per stage) for
the lengths of dropped documents. Nothing here depends on time or on the folder's own path.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline import secret_fields, storage
from pipeline.card.profile import log2_bin
from pipeline.nesting import TooDeep, load_yaml

#: the card: the output's README.md, where the Hub and ``datasets`` read a dataset's card and its ``configs``
CARD = "README.md"
#: where cards were written before they were the README (``tokenmill card`` replaces one it finds)
OLD_CARD = "CARD.md"
CARD_DIR = "card"
SPEC = "spec.yaml"
#: rejected records read per stage for the dropped documents' lengths
SAMPLE_PER_STAGE = 500
SAMPLE_BYTES = 8 << 20
#: tokens per text by the tokenizer given as JSON, as the job's write phase counts them (:func:`token_counts` here;
#: a job passes one that runs on its workers)
TokenCounter = Callable[[str, list[str]], list[int]]


def _read_json(folder: str, name: str) -> Any:
    path = storage.join(folder, name)
    return json.loads(storage.read_text(path)) if storage.exists(path) else None


@dataclass
class Dropped:
    """A sample of the dropped documents: log2 histograms of characters and tokens."""

    docs: int = 0
    chars: Counter[int] = field(default_factory=Counter)
    tokens: Counter[int] = field(default_factory=Counter)


@dataclass
class CardData:
    name: str
    stats: dict[str, Any]
    manifest: dict[str, Any] | None
    documents: dict[str, Any] | None
    spec: dict[str, Any] | None
    vocab_size: int | None
    dropped: Dropped
    versions: dict[str, str]
    #: the kept documents' ``meta.lang`` values (:mod:`pipeline.card.languages`; None: not recorded)
    kept_languages: list[str] | None = None
    #: the local paths the card and ``card/spec.yaml`` do not show (:mod:`pipeline.card.paths`)
    redacted: list[dict[str, str]] = field(default_factory=list)

    @property
    def stages(self) -> list[dict[str, Any]]:
        return list(self.stats.get("stages") or [])

    def stage(self, stage_type: str) -> dict[str, Any] | None:
        """The first stage entry of a type (``lid``: key ``04-lid``)."""
        return next((s for s in self.stages if re.sub(r"^[0-9]+-", "", s["stage"]) == stage_type), None)

    def counters(self, stage_type: str, prefix: str) -> dict[str, int]:
        s = self.stage(stage_type)
        found = (s or {}).get("counters") or {}
        return {k[len(prefix):]: int(v) for k, v in sorted(found.items()) if k.startswith(prefix)}

    @property
    def languages(self) -> dict[str, int]:
        """Documents per language as the ``lid`` stage counted them (``lang:<code>``)."""
        return self.counters("lid", "lang:")

    @property
    def kept_docs(self) -> int:
        if self.documents is not None:
            return int(self.documents.get("rows", 0))
        tok = next((s for s in self.stages if s["stage"] == "90-tokenize"), None)
        if tok is not None:
            return int(tok["docs_in"])
        curate = [s for s in self.stages if s["stage"] != "90-tokenize"]
        return int(curate[-1]["docs_out"]) if curate else 0

    @property
    def profile(self) -> dict[str, Any] | None:
        return self.stats.get("profile")

    def drop_reasons(self) -> dict[str, int]:
        """Every reason a stage dropped (or in annotate mode would drop) documents for, ``stage:reason`` keyed."""
        out: dict[str, int] = {}
        for s in self.stages:
            stage = re.sub(r"^[0-9]+-", "", s["stage"])
            for reason, n in (s.get("dropped") or {}).items():
                out[reason if ":" in reason else f"{stage}:{reason}"] = int(n)
            for key, n in ((s.get("counters") or {}).items()):
                if key.startswith("would_drop:"):
                    reason = key[len("would_drop:"):]
                    out[f"{reason} (annotated)" if ":" in reason else f"{stage}:{reason} (annotated)"] = int(n)
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def spec_for_card(spec_json: dict[str, Any]) -> dict[str, Any]:
    """The spec as ``card/spec.yaml`` holds it: secrets redacted (:mod:`pipeline.secret_fields`), ``output.path``
    made ``rebuilt`` (relative to ``card/``, so rebuilding never writes over this output) and no ``overwrite``:
    the same for every output folder the spec was run into."""
    spec = dict(secret_fields.redact(spec_json))
    out = dict(spec.get("output") or {})
    out["path"], out["overwrite"] = "rebuilt", False
    out.pop("card_compare", None)
    spec["output"] = out
    return spec


def package_versions() -> dict[str, str]:
    out = {}
    for name in ("tokenmill", "ray", "tokenizers"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "unknown"
    return out


def collect(folder: str, count_tokens: TokenCounter | None = None) -> CardData:
    """Everything the card shows about the output in ``folder``; ValueError when it holds no ``stats.json`` or a
    ``card/spec.yaml`` nested deeper than :data:`pipeline.nesting.MAX_DEPTH`. ``count_tokens``: how the dropped
    sample is tokenized (default :func:`token_counts`, in this process)."""
    stats = _read_json(folder, "stats.json")
    if not isinstance(stats, dict):
        raise ValueError(f"{folder}: no stats.json (not a finished tokenmill output)")
    spec_path = storage.join(folder, CARD_DIR, SPEC)
    try:
        spec = load_yaml(storage.read_text(spec_path)) if storage.exists(spec_path) else None
    except TooDeep as exc:  # a spec.yaml edited by hand: one line, not a parser's RecursionError
        raise ValueError(exc.at(spec_path)) from None
    manifest = _read_json(folder, "manifest.json")
    tok_path = storage.join(folder, "tokenizer.json")
    tokenizer = storage.read_text(tok_path) if storage.exists(tok_path) else None
    vocab = int(manifest["vocab_size"]) if isinstance(manifest, dict) and "vocab_size" in manifest else None
    return CardData(str(stats.get("job", "")), stats, manifest, _read_json(folder, "documents.json"), spec, vocab,
                    dropped_sample(folder, tokenizer, count_tokens), package_versions())


def dropped_sample(folder: str, tokenizer_json: str | None, count_tokens: TokenCounter | None = None) -> Dropped:
    """The lengths of a bounded sample of ``rejected/``: per stage folder, its files in name order (named by batch
    key, so the same on every run), until :data:`SAMPLE_PER_STAGE` records or :data:`SAMPLE_BYTES` bytes."""
    root = storage.join(folder, "rejected")
    texts: list[str] = []
    if storage.exists(root):
        per_stage: dict[str, list[str]] = {}
        for path in sorted(storage.list_files(root)):
            stage = path[len(root):].strip("/").split("/", 1)[0]
            per_stage.setdefault(stage, []).append(path)
        for paths in per_stage.values():
            texts += _sample_texts(paths)
    out = Dropped(docs=len(texts))
    for t in texts:
        out.chars[log2_bin(len(t))] += 1
    if tokenizer_json is not None and texts:
        for n in (count_tokens or token_counts)(tokenizer_json, texts):
            out.tokens[log2_bin(n)] += 1
    return out


def token_counts(tokenizer_json: str, texts: list[str]) -> list[int]:
    """Tokens per text as the job's write phase counts them (special tokens' text as plain text; the same ids
    through :mod:`pipeline.fast.byte_level_bpe` where it applies, several times faster than ``tokenizers``)."""
    from tokenizers import Tokenizer  # loaded only when there is something to encode

    from pipeline.fast.byte_level_bpe import FastByteLevelBPE

    tok = Tokenizer.from_str(tokenizer_json)
    tok.encode_special_tokens = True
    if FastByteLevelBPE.supports(tok):
        return [len(ids) for ids in FastByteLevelBPE(tok).encode_batch(texts)]
    return [len(e.ids) for e in tok.encode_batch_fast(texts, add_special_tokens=False)]


def _sample_texts(paths: list[str]) -> list[str]:
    texts: list[str] = []
    used = 0
    for path in paths:
        data = storage.read_bytes(path)
        for line in data.splitlines():
            if len(texts) >= SAMPLE_PER_STAGE or used >= SAMPLE_BYTES:
                return texts
            used += len(line)
            try:
                text = json.loads(line).get("text")
            except (ValueError, AttributeError):
                continue
            if isinstance(text, str):
                texts.append(text)
    return texts
