"""Ablation: does the full filter and dedup chain make a better small model than normalize alone, and by more
than the seed noise? ``tokenmill ablate`` with two variants (``raw``: normalize; ``curated``: the filter and dedup
chain) of one raw corpus, at an equal token budget, 3 seeds each, on the CPU proxy (training/configs/proxy-cpu.yaml).

The raw corpus: English prose, web pages and code from ../shared/corpora (pages of at most ``PAGE`` characters),
with a known share of low-quality documents mixed in (``quality: junk``, ``junk``: boilerplate (the same
navigation and footer lines over and over), keyword spam, near-duplicate pages (edited copies of web pages that
are not otherwise in the corpus), character garbage, templated pages (one template, many cities and services)).

Headline: bits per byte on the *clean* part of the common validation set (``common.clean``): documents held out
from the raw corpus before any filter (so no filter chooses them) whose source is a real corpus, not the injected
junk. Also reported: bits per byte on the whole common set (junk included: there normalize-only has seen junk like
it and may win, which says nothing about the model's quality on text one wants) and the benchmark tasks.

    scripts/netns.sh .venv/bin/python bench/ablation.py [--quick] [--work DIR]

Prints one JSON line: bpb_raw, bpb_curated (clean common set), loss_gap (raw - curated), seed_spread (largest
max - min within a variant), gap_over_spread (goal >= 2), minutes (goal <= 30 on 2 cores), tasks, and more:
``bpb_clean_by_seed``, each run's score (whether one seed makes the spread), and ``kept_by_kind``, per variant
how many documents of each kind of clean text and of junk its job kept and the rules that dropped clean ones
(read from the labels after the jobs ran; no stage of either chain reads them).
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import json
import os
import random
import shutil
import string
import subprocess
import tempfile
import time
from typing import Any

import yaml

from bench.common import CORPORA, REPO, emit_json, iter_jsonl

GOAL_GAP_OVER_SPREAD, GOAL_MINUTES = 2.0, 30.0
PAGE = 4000  #: characters per page a long clean document is cut into
#: clean bytes per kind of text (shares of the clean corpus)
CLEAN_MIX = {"prose": 0.5, "web": 0.2, "code": 0.3}
PROSE = ("english/bible_kjv.jsonl.gz", "english/gutenberg.jsonl.gz", "english/debian_handbook.jsonl.gz",
         "english/python_docs.jsonl.gz")
WEB, CODE = "web/html_gold_aeb.jsonl.gz", "code/code.jsonl.gz"
JUNK_KINDS = ("boilerplate", "spam", "neardup", "garbage", "template")
#: the curated chain, with Gopher's thresholds loosened where they drop clean code (the corpus is a third code),
#: as a user who read ``tokenmill report``'s examples would: the duplicate n-gram rules, the alphabetic-words
#: ratio and the word length; the duplicate-line rules from 0.3 / 0.2 to 0.5 / 0.4 (code repeats its closing
#: braces, ``else:`` and ``return`` lines; a page whose lines are mostly repeats still goes). The stop-word rule
#: stays: code carries its programming language in ``lang``, for which Gopher has no stop-word list, so the rule
#: skips it (docs/filters.md) while it still holds prose, web pages and spam to English function words
CURATED = [{"type": "normalize"},
           {"type": "gopher_repetition", "params": {"dup_ngram_char_ratio": {}, "max_dup_line_ratio": 0.5,
                                                    "max_dup_line_char_ratio": 0.4}},
           {"type": "gopher_quality", "params": {"min_alpha_words_ratio": None, "max_avg_word_length": 20,
                                                 "min_words": 20, "max_symbol_word_ratio": 0.5}},
           {"type": "exact_dedup"},
           {"type": "near_dedup", "params": {"threshold": 0.7}}]
#: size of a full and a --quick run: megabytes of clean text in the raw corpus (the junk comes on top, so every
#: junk share has the same clean text), tokens per proxy run, benchmark items per task; a quick run's 20 steps
#: warm up over 4 (the proxy's 20 would end every run, and its evaluation, at the peak learning rate)
SIZES = {"full": {"clean_mb": 1.4, "tokens": 400_000, "limit": 100},
         "quick": {"clean_mb": 0.42, "tokens": 40_000, "limit": 40, "warmup": 4}}
#: junk's share of the raw corpus's bytes. Half: less than a raw web crawl loses to quality filters and dedup
#: (FineWeb keeps a small part of CommonCrawl's text), since the clean text here is mostly books, documentation
#: and code; 0.3, the earlier default, gives the earlier corpus (the same clean text, less junk)
JUNK_SHARE = 0.5


def pages(text: str, size: int = PAGE) -> list[str]:
    """``text`` cut at paragraph ends into pages of at most about ``size`` characters."""
    out: list[str] = []
    cur = ""
    for para in text.split("\n\n"):
        if cur and len(cur) + len(para) > size:
            out.append(cur)
            cur = ""
        cur = f"{cur}\n\n{para}" if cur else para[: size * 2]
    return [p for p in [*out, cur] if p.strip()]


def clean_docs(kind: str, files: list[str], budget: int, rng: random.Random) -> list[dict[str, Any]]:
    """Pages of ``files`` (in a seeded random order) up to ``budget`` characters, labelled ``kind``; a page keeps
    its record's ``lang`` (the code corpus's programming language, as code datasets such as The Stack carry it)."""
    found = [(f, i, p, rec.get("lang")) for f in files for i, rec in enumerate(iter_jsonl(CORPORA / f))
             for p in pages(str(rec.get("text") or ""))]
    rng.shuffle(found)
    out: list[dict[str, Any]] = []
    size = 0
    for f, i, p, lang in found:
        if size >= budget:
            break
        out.append({"id": f"{kind}-{Path(f).name.split('.')[0]}-{i}-{len(out)}", "text": p, "source": kind,
                    "quality": "clean", **({"lang": lang} if lang else {})})
        size += len(p)
    return out


def junk_doc(kind: str, n: int, rng: random.Random, seeds: list[str]) -> list[dict[str, Any]]:
    """One junk document of ``kind`` (a near-duplicate kind: several edited copies of one seed page)."""
    if kind == "boilerplate":
        lines = ["Home | About us | Products | Blog | Contact", "Copyright 2024 All rights reserved.",
                 "Subscribe to our newsletter for the latest deals!", "We use cookies to improve your experience. "
                 "Accept all cookies", "Share on Facebook | Twitter | Pinterest", "Privacy Policy | Terms of Use"]
        text = "\n".join(rng.choice(lines) for _ in range(rng.randint(40, 80)))
    elif kind == "spam":
        words = ("cheap best buy online discount free shipping casino bonus win loans crypto pills deal offer "
                 "price sale top rated replica watches bitcoin earn money fast click here now").split()
        text = " ".join(rng.choice(words) for _ in range(rng.randint(200, 500)))
    elif kind == "garbage":
        alphabet = string.ascii_letters + string.digits + "+/=ÃÂ©â€™¤¦§¨ª«¬®¯°±²³"
        text = "\n".join("".join(rng.choice(alphabet) for _ in range(76)) for _ in range(rng.randint(20, 50)))
    elif kind == "template":
        city = rng.choice(["Springfield", "Riverton", "Lakeside", "Fairview", "Greenville", "Madison", "Salem"])
        service = rng.choice(["plumber", "locksmith", "roofing", "dentist", "moving company", "carpet cleaning"])
        text = "\n".join(f"Best {service} in {city}! Looking for a {service} in {city}? Our {adj} {service} team "
                         f"serves {city} and nearby. Call now for a free quote on {service} in {city}."
                         for adj in rng.sample(["trusted", "local", "affordable", "licensed", "expert", "friendly",
                                                "reliable", "top"], 6))
    else:  # neardup: 6 copies of one page, each with 2 % of its words changed
        seed = seeds[n % len(seeds)].split()
        copies = []
        for c in range(6):
            words = [rng.choice(["the", "a", "new", "one"]) if rng.random() < 0.02 else w for w in seed]
            copies.append({"id": f"junk-neardup-{n}-{c}", "text": " ".join(words), "source": "junk",
                           "quality": "junk", "junk": kind})
        return copies
    return [{"id": f"junk-{kind}-{n}", "text": text, "source": "junk", "quality": "junk", "junk": kind}]


def build_corpus(path: Path, clean_mb: float, junk_share: float, seed: int = 0) -> dict[str, Any]:
    """The raw corpus (JSONL, shuffled): ``clean_mb`` megabytes of clean text and junk up to ``junk_share`` of all
    its bytes; what it holds."""
    rng = random.Random(seed)
    clean = clean_mb * 1e6
    total = clean / (1 - junk_share)
    web = [str(r.get("text") or "") for r in iter_jsonl(CORPORA / WEB)]
    rng.shuffle(web)
    seeds, web_clean = web[: len(web) // 3], web[len(web) // 3:]  # a near-duplicate's page is not clean text too
    docs = clean_docs("prose", list(PROSE), int(clean * CLEAN_MIX["prose"]), rng)
    docs += clean_docs("code", [CODE], int(clean * CLEAN_MIX["code"]), rng)
    web_docs, size = [], 0
    for i, text in enumerate(web_clean):
        if size < clean * CLEAN_MIX["web"]:
            web_docs.append({"id": f"web-{i}", "text": text[: PAGE * 2], "source": "web", "quality": "clean"})
            size += len(web_docs[-1]["text"])
    docs += web_docs
    junk: list[dict[str, Any]] = []
    n = 0
    while sum(len(d["text"]) for d in junk) < total * junk_share:
        junk += junk_doc(JUNK_KINDS[n % len(JUNK_KINDS)], n, rng, seeds)
        n += 1
    docs += junk
    rng.shuffle(docs)
    with open(path, "w") as fh:
        for d in docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    junk_bytes = sum(len(d["text"]) for d in junk)
    return {"documents": len(docs), "junk_documents": len(junk), "megabytes": round(sum(len(d["text"]) for d in docs)
            / 1e6, 2), "junk_byte_share": round(junk_bytes / max(1, sum(len(d["text"]) for d in docs)), 3)}


def ablation_file(work: Path, size: dict[str, Any], seeds: list[int], proxy_set: dict[str, Any] | None = None) -> Path:
    """The ablation file of the bench: raw against curated, one proxy (its config's values overridden by the size's
    warmup and ``proxy_set``), the clean part of the common set apart."""
    tasks = [f"{kind}:{CORPORA / 'bench' / name}" for kind, name in
             (("mmlu", "mmlu_test.jsonl.gz"), ("gsm8k", "gsm8k_test.jsonl.gz")) if (CORPORA / "bench" / name).exists()]
    spec = {"name": "bench-ablation", "raw": {"path": "raw.jsonl", "format": "jsonl"},
            "base": {"packing": {"seq_len": 256}, "output": {"samples_per_shard": 512}},
            "variants": {"raw": {"stages": [{"type": "normalize"}]}, "curated": {"stages": CURATED}},
            "tokenizer": {"vocab_size": 4096, "sample_docs": 5000},
            "budget": {"tokens": size["tokens"]},
            "proxy": {"config": str(REPO / "training" / "configs" / "proxy-cpu.yaml"),
                      "set": {**({"optim.warmup_steps": size["warmup"]} if "warmup" in size else {}),
                              **(proxy_set or {})}},
            "seeds": seeds, "validation": {"share": 0.1, "by": "quality"}, "tasks": tasks,
            "eval": {"limit": size["limit"]}, "out": "out"}
    path = work / "ablation.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def kept_by_kind(out: Path) -> dict[str, Any]:
    """Per variant, the documents of each kind (``prose``, ``web``, ``code``, or the junk's kind) its job kept, of
    those it read, and per kind of clean text the rules that dropped some (from ``rejected/``): what shows whether
    a chain removes the junk and spares the clean text."""
    kind: dict[str, str] = {}
    for rec in iter_jsonl(out / "raw" / "train.jsonl"):
        kind[rec["id"]] = rec.get("junk") or rec.get("source") or "none"
    read: dict[str, int] = {}
    for k in kind.values():
        read[k] = read.get(k, 0) + 1
    found: dict[str, Any] = {}
    for folder in sorted((out / "variants").glob("*/data")):
        dropped: dict[str, int] = {}
        clean_reasons: dict[str, dict[str, int]] = {}
        for path in sorted(folder.glob("rejected/*/*.jsonl")):
            for rec in iter_jsonl(path):
                k = kind.get(rec["id"], "none")
                dropped[k] = dropped.get(k, 0) + 1
                if k in CLEAN_MIX:
                    why = clean_reasons.setdefault(k, {})
                    why[rec["reason"]] = why.get(rec["reason"], 0) + 1
        found[folder.parent.name] = {"kept": {k: f"{n - dropped.get(k, 0)}/{n}" for k, n in sorted(read.items())},
                                     "clean_dropped_by": clean_reasons}
    return found


def by_seed(out: Path, key: str = "common.clean") -> dict[str, dict[str, float]]:
    """Per variant, each seed's score ``key`` (its run's ``eval.json``): whether one seed makes the spread."""
    found: dict[str, dict[str, float]] = {}
    for path in sorted((out / "variants").glob("*/seed-*/eval.json")):
        task = json.loads(path.read_text())["tasks"].get(key) or {}
        if "value" in task:
            found.setdefault(path.parent.parent.name, {})[path.parent.name] = round(task["value"], 4)
    return found


def headline(data: dict[str, Any], minutes: float, corpus: dict[str, Any]) -> dict[str, Any]:
    """The bench's JSON line from ablation.json."""
    v = data["variants"]

    def score(name: str, key: str) -> dict[str, Any]:
        return v[name]["scores"].get(key) or {}

    key = "common.clean"
    raw, cur = score("raw", key), score("curated", key)
    spread = max(raw.get("spread", 0.0), cur.get("spread", 0.0))
    gap = raw.get("mean", float("nan")) - cur.get("mean", float("nan"))
    tasks = {name: {k: round(s["mean"], 4) for k, s in v[name]["scores"].items() if not k.startswith(("common", "own"))
                    and s} for name in v}
    return {"bench": "ablation", "bpb_raw": round(raw.get("mean", float("nan")), 4),
            "bpb_curated": round(cur.get("mean", float("nan")), 4), "loss_gap": round(gap, 4),
            "seed_spread": round(spread, 4), "gap_over_spread": round(gap / spread, 2) if spread else None,
            "minutes": round(minutes, 1), "tasks": tasks, "headline_set": key,
            "bpb_all_common": {n: round(score(n, "common").get("mean", float("nan")), 4) for n in v},
            "bpb_junk_common": {n: round(score(n, "common.junk").get("mean", float("nan")), 4) for n in v},
            "bpb_own_validation": {n: round(score(n, "own").get("mean", float("nan")), 4) for n in v},
            "seeds": data["seeds"], "budget_tokens": data["budget_tokens"], "max_steps": data["max_steps"],
            "epochs": {n: v[n]["data"]["epochs"] and round(v[n]["data"]["epochs"], 2) for n in v},
            "kept_documents": {n: v[n]["data"]["kept"] for n in v}, "corpus": corpus,
            "goals": {"gap_over_spread": GOAL_GAP_OVER_SPREAD, "minutes": GOAL_MINUTES}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="a reduced run: a smaller corpus and budget (not the goal's)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--junk-share", type=float, default=JUNK_SHARE,
                   help="share of the raw corpus's bytes that is junk (below 1)")
    p.add_argument("--work", type=Path, help="keep everything here (a rerun resumes); default: a temporary folder")
    p.add_argument("--proxy-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value of the proxy's config (YAML value), e.g. optim.lr=1.5e-3; repeatable")
    p.add_argument("--variant", help="record the run as this named variant beside the headline run")
    args = p.parse_args()
    proxy_set: dict[str, Any] = {}
    for item in args.proxy_set:
        key, eq, value = item.partition("=")
        if not eq or not key:
            p.error(f"--proxy-set {item!r}: KEY=VALUE")
        proxy_set[key] = yaml.safe_load(value)
    if not 0 <= args.junk_share < 1:
        p.error(f"--junk-share {args.junk_share}: a share of the bytes, at least 0 and below 1")
    size = SIZES["quick" if args.quick else "full"]
    work = args.work or Path(tempfile.mkdtemp(prefix="tokenmill-ablation-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    corpus_file = work / "corpus.json"  # a rerun in the same --work reuses the corpus (and so every finished step)
    if not corpus_file.exists():
        corpus_file.write_text(json.dumps(build_corpus(work / "raw.jsonl", size["clean_mb"], args.junk_share)))
    corpus = json.loads(corpus_file.read_text())
    spec = ablation_file(work, size, list(range(args.seeds)), proxy_set)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = subprocess.call([sys.executable, "-m", "service.cli", "ablate", str(spec)], env=env, cwd=REPO)
    if code != 0:
        print(f"tokenmill ablate exited {code}; everything is in {work}", file=sys.stderr)
        return code
    data = json.loads((work / "out" / "ablation.json").read_text())
    result = headline(data, (time.perf_counter() - t0) / 60, corpus)
    result["kept_by_kind"] = kept_by_kind(work / "out")
    result["bpb_clean_by_seed"] = by_seed(work / "out")
    result["quick"] = args.quick
    if proxy_set:
        result["proxy_set"] = proxy_set
    emit_json(result, variant=args.variant)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
