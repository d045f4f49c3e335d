"""Cost at scale: the full curation chain on 0.25 / 1 / 4 GB of generated text, seconds and CPU-seconds per GB.

For each size this script builds a corpus, runs ``tokenmill run`` on it as a child process (``python -m
service.cli run spec.yaml``: the job exactly as a user runs it, with its own local Ray), watches the child's
whole process tree while it runs, and reports, per size and per phase, wall seconds and CPU-seconds per GB of
input text. The chain: normalize, lid (every language kept: ``languages`` unset, so only ``low_score`` drops),
gopher_repetition, gopher_quality, c4, fineweb, pii (redact), exact_dedup, near_dedup (threshold 0.7,
``--near-threshold``: see below), then a BPE tokenizer trained on the job's first documents (vocab 32,000; the
spec's default sample, 20,000 documents or 50 MB, so a fixed cost), best-fit packing at seq_len 2048 and the
shards written. Run it inside the loopback-only namespace:

    scripts/netns.sh .venv/bin/python bench/scale.py [--sizes 0.25,1,4] [--parallelism 2] [--work DIR --keep]

**The corpus** (deterministic for a ``--seed``; a smaller size is a prefix of a larger one, document for
document). Paragraphs (split at blank lines, 24-2,000 characters: longer ones are cut at a line break or a
space, exact repeats dropped) of every ``english/*``, ``web/*`` (their ``text``), ``code/*`` and ``lid/*``
JSONL.gz file of ``../shared/corpora`` form the pools: English prose (every english/ and web/ file and the
English paragraphs of lid/, one pool per file), code (one pool per language of ``code.jsonl.gz``) and one pool
per other language of lid/ (languages with fewer than 1,000 paragraphs left out). A new document is prose (65 %:
each paragraph from a file drawn by its pool's size, so a document mixes sources), code (15 %: one language,
paragraphs from different files) or another language (20 %: one language drawn by its pool's size, so every pool
is reused about equally often), made of 3-12 distinct paragraphs joined by a blank line, more added (up to 12)
while one paragraph is over half the document. ~5 % of the paragraphs get one word swapped with the next,
dropped or suffixed. So two new documents share a paragraph only by chance, and one shared paragraph is at most
half of either: word-5-gram Jaccard <= 1/3, far below any dedup threshold (checked: 60 MB, 25,798 documents
built without copies, exact_dedup and near_dedup at 0.7 dropped none). Then each document slot is, with
probability 0.05, a verbatim copy of an earlier new document (drawn uniformly from a reservoir of 4,096 of
them), with 0.10 a near copy of one (3 % of its words swapped, dropped or suffixed: word-5-gram Jaccard to the
original: median 0.76, 97 % >= 0.7, 19 % >= 0.8, which is why near_dedup runs at 0.7, not its default 0.8),
else a new document. The planned copies are counted and printed next to what exact_dedup and near_dedup dropped
(a copy of a document a filter dropped is dropped by the same filter, so the dedup stages see fewer). Files are
JSONL.gz at gzip level 1, ``{"id", "text"}`` per line, cut at ``min(128 MB, size / (2 x parallelism))`` of text
so every size gives at least two files per worker (the readers then run the filters in their own workers at
every size, the same graph) and 62-128 MB files at the real sizes: compressed like real dumps and the shared
corpora (the job pays gunzip as it would), about half the disk of plain JSONL, at a little more time to build.
A size is UTF-8 bytes of ``text``, 1 GB = 1e9 bytes. The build streams (it prints its rate): only the
pools (~130 MB of text, ~280 MB of memory) and the reservoir are held; every corpus is built before the first
job and the pools freed.

**What is measured**, and where it is read:

- wall seconds per phase: the timestamps of the job's events in ``OUT/.tokenmill/events.jsonl``
  (``ray_starting``, ``ray_started``, each phase's ``started``/``finished``, ``job_finished``) against the
  child's start and exit; ``startup`` is the CLI's start before Ray, ``other`` the gaps between phases (spec
  checks, Ray's shutdown at the end).
- CPU-seconds of the whole tree, from ``/proc``: every ``--interval`` (0.5 s) this process reads
  ``/proc/PID/stat`` of every process below it. It makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), so
  every process the job starts (driver, GCS, raylet, Ray workers, agents), even one orphaned by its parent,
  stays below it. A process counts with its own ``utime+stime`` as last seen, kept after it exits (keyed by pid
  and start time); when children leave, what their parent's ``cutime+cstime`` (or this process's
  ``RUSAGE_CHILDREN``) grew beyond their last samples is added (their last moments, processes too short to be
  sampled). The kernel's own sum alone is no measure: Ray's raylet ignores SIGCHLD, so its workers are reaped
  by the kernel and their CPU is added to no one's ``cutime`` (a run's kernel total was a fifth of this). So a
  worker's last moments, after its last sample, are unseen: ``cpu_tail_bound_s`` bounds them (each such
  process's rate over its last interval x one interval). Per phase: that series interpolated at the phase
  boundaries.
- peak RSS: ``VmHWM`` (the kernel's high-water mark) of ``/proc/PID/status``, read at every sample, for the
  driver (the ``tokenmill run`` process) and for the largest single process (named by its command line:
  Ray's raylet holds the object store's shared memory, workers count the object pages they map); also the
  largest ``RssAnon`` sampled (private memory, without shared pages).
- spilled bytes: every file seen in the Ray session's ``ray_spilled_objects_<node>`` folder (the session is
  ``$RAY_TMPDIR``, ``$TMPDIR`` or ``/tmp``, ``ray/session_*_<driver pid>``), each at the largest size seen,
  summed; and the raylet's last ``Spilled N MiB`` line in ``logs/raylet.out`` (Ray logs it at most once a
  second, so it can lag the files). The larger of the two counts.
- disk at its peak: every ``--du-every`` (1 s) the allocated bytes (as ``du``) of ``OUT/.tokenmill/work`` and
  of the spill folder; the peak of each and of their sum at one sample.

Printed: a table per size (phase, wall s, s/GB, CPU-s, CPU-s/GB, cores busy), one across the sizes, then one
JSON line: ``sizes_gb``, ``per_size`` (every figure above), ``growth`` (s/GB at the largest size / at the
smallest), ``driver_rss_growth`` (the same for the driver's peak RSS), ``max_rss_growth`` (for the largest
process's private memory, ``RssAnon`` as sampled: ``VmHWM`` also counts the pages of Ray's shared object store a
worker maps while it reads a block, which belong to the node's object-store budget, not to the process; the
``VmHWM`` ratio is ``max_hwm_growth``), ``core_hours_per_tb``
(CPU-s per GB at the largest size x 1000 / 3600), ``cost_slope`` (least squares of CPU-seconds against GB:
``slope`` in CPU-s per GB, ``intercept`` in CPU-s), ``spilled_gb`` (largest size), ``calibration`` (this machine's
speed on the day: fastText's ``predict`` on a fixed 20,000 documents of the smallest corpus, CPU-seconds; compare
runs made on different days through it). Sizes of 0.1 GB or less are a smoke test: the fixed costs (Ray start,
the tokenizer's training, the model loads) dominate them.
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import ctypes
import gc
import gzip
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate
from random import Random
from typing import Any

import yaml

from bench.common import CORPORA, REPO, emit_json, iter_jsonl

# ---------------------------------------------------------------- the corpus

SOURCE_GLOBS = ("english/*.jsonl.gz", "web/*.jsonl.gz", "code/*.jsonl.gz", "lid/*.jsonl.gz")
PARA_MIN, PARA_MAX = 24, 2000
KIND_WEIGHTS = {"prose": 0.65, "code": 0.15, "lang": 0.20}
MIN_LANG_PARAS = 1000
PARA_EDIT_RATE = 0.05
EXACT_RATE, NEAR_RATE, NEAR_EDIT = 0.05, 0.10, 0.03
RESERVOIR = 4096
SUFFIXES = ("s", "ed", "ing", "er", "ly", "2", "x")
_PARA_SPLIT = re.compile(r"\n[ \t]*\n+")
_WORD = re.compile(r"\S+")


@dataclass
class Pool:
    name: str
    paras: list[str] = field(default_factory=list)
    chars: int = 0


@dataclass
class Pools:
    prose: list[Pool]
    code: list[Pool]
    lang: list[Pool]

    def summary(self) -> str:
        def mb(pools: list[Pool]) -> str:
            return f"{sum(p.chars for p in pools) / 1e6:.0f} MB in {sum(len(p.paras) for p in pools):,} paragraphs"

        return (f"prose {mb(self.prose)} ({len(self.prose)} files), code {mb(self.code)} "
                f"({', '.join(p.name for p in self.code)}), other languages {mb(self.lang)} ({len(self.lang)})")


def split_paragraphs(text: str) -> list[str]:
    """Blank-line paragraphs of ``text``, each PARA_MIN..PARA_MAX characters (a longer one cut at a line break,
    else a space, else anywhere); the indentation of code is kept."""
    out = []
    for para in _PARA_SPLIT.split(text):
        para = para.strip("\n").rstrip()
        while len(para) > PARA_MAX:
            cut = para.rfind("\n", PARA_MAX // 2, PARA_MAX)
            if cut < 0:
                cut = para.rfind(" ", PARA_MAX // 2, PARA_MAX)
            if cut < 0:
                cut = PARA_MAX
            head, para = para[:cut].rstrip(), para[cut:].strip("\n").lstrip(" ")
            if len(head.strip()) >= PARA_MIN:
                out.append(head)
        if len(para.strip()) >= PARA_MIN:
            out.append(para)
    return out


def load_pools(data: Path) -> Pools:
    files = [p for g in SOURCE_GLOBS for p in sorted(data.glob(g))]
    if not files:
        sys.exit(f"no corpora under {data} (pass --data)")
    seen: set[bytes] = set()
    prose: dict[str, Pool] = {}
    code: dict[str, Pool] = {}
    lang: dict[str, Pool] = {}
    for path in files:
        group = path.parent.name
        for rec in iter_jsonl(path):
            text = rec.get("text")
            if not isinstance(text, str):
                continue
            if group == "code":
                pool = code.setdefault(str(rec.get("lang") or "code"), Pool(f"code:{rec.get('lang')}"))
            elif group == "lid" and rec.get("lang") not in (None, "en"):
                pool = lang.setdefault(str(rec["lang"]), Pool(f"lid:{rec['lang']}"))
            else:
                name = f"{group}/{path.name.split('.')[0]}" if group != "lid" else "lid:en"
                pool = prose.setdefault(name, Pool(name))
            for para in split_paragraphs(text):
                key = hashlib.blake2b(para.encode("utf-8", "surrogatepass"), digest_size=8).digest()
                if key not in seen:
                    seen.add(key)
                    pool.paras.append(para)
                    pool.chars += len(para)
    langs = [p for _, p in sorted(lang.items()) if len(p.paras) >= MIN_LANG_PARAS]
    return Pools([p for _, p in sorted(prose.items()) if p.paras], [p for _, p in sorted(code.items()) if p.paras],
                 langs)


def edit_words(text: str, n: int, rng: Random) -> str:
    """``text`` with ``n`` words (at distinct places) swapped with the next, dropped or given a suffix; the
    whitespace between words (line breaks, indentation) stays as it was."""
    spans = [m.span() for m in _WORD.finditer(text)]
    if len(spans) < 2:
        return text
    picks = sorted(rng.sample(range(len(spans) - 1), min(n, len(spans) - 1)))
    out, pos, skip = [], 0, -1
    for i in picks:
        if i <= skip:
            continue
        s, e = spans[i]
        out.append(text[pos:s])
        op = rng.randrange(3)
        if op == 0:  # swap with the next word
            s2, e2 = spans[i + 1]
            out.append(text[s2:e2] + text[e:s2] + text[s:e])
            pos, skip = e2, i + 1
        elif op == 1:  # drop it (and the whitespace after it)
            pos = spans[i + 1][0]
        else:
            out.append(text[s:e] + rng.choice(SUFFIXES))
            pos = e
    out.append(text[pos:])
    return "".join(out)


class DocMaker:
    """New documents from the pools (see the module docstring), one per call."""

    def __init__(self, pools: Pools, rng: Random) -> None:
        self.rng = rng
        self.kinds = [(k, w) for k, w in KIND_WEIGHTS.items() if getattr(pools, k)]
        self.kind_cum = list(accumulate(w for _, w in self.kinds))
        self.groups = {k: (getattr(pools, k), list(accumulate(p.chars for p in getattr(pools, k))))
                       for k, _ in self.kinds}

    def _pick(self, pools: list[Pool], cum: list[int]) -> Pool:
        return pools[bisect_left(cum, self.rng.random() * cum[-1])]

    def __call__(self) -> str:
        rng = self.rng
        kind = self.kinds[bisect_left(self.kind_cum, rng.random() * self.kind_cum[-1])][0]
        pools, cum = self.groups[kind]
        fixed = None if kind == "prose" else self._pick(pools, cum)  # code and other languages: one pool
        want = rng.randint(3, 12)
        picks: list[str] = []
        used: set[tuple[str, int]] = set()
        total = largest = 0
        tries = 0
        while (len(picks) < want or 2 * largest > total) and len(picks) < 12 and tries < 64:
            tries += 1
            pool = fixed or self._pick(pools, cum)
            i = rng.randrange(len(pool.paras))
            if (pool.name, i) in used:
                continue
            used.add((pool.name, i))
            para = pool.paras[i]
            if rng.random() < PARA_EDIT_RATE:
                para = edit_words(para, 1, rng)
            picks.append(para)
            total += len(para)
            largest = max(largest, len(para))
        return "\n\n".join(picks)


@dataclass
class Corpus:
    folder: Path
    files: int
    docs: int
    text_bytes: int
    new_docs: int
    exact_copies: int
    near_copies: int
    build_s: float


def build_corpus(folder: Path, target_bytes: int, file_bytes: int, pools: Pools, seed: int) -> Corpus:
    """Stream documents into ``folder/part-NNNNN.jsonl.gz`` until ``target_bytes`` of text are written."""
    t0 = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    rng = Random(seed)
    make = DocMaker(pools, rng)
    reservoir: list[str] = []
    counts = {"new": 0, "exact": 0, "near": 0}
    total = docs = files = 0
    out: Any = None
    in_file = 0
    buf: list[bytes] = []
    try:
        while total < target_bytes:
            u = rng.random()
            if reservoir and u < EXACT_RATE:
                text, what = reservoir[rng.randrange(len(reservoir))], "exact"
            elif reservoir and u < EXACT_RATE + NEAR_RATE:
                base = reservoir[rng.randrange(len(reservoir))]
                text = edit_words(base, max(1, round(NEAR_EDIT * len(_WORD.findall(base)))), rng)
                what = "near"
            else:
                text, what = make(), "new"
                n = counts["new"]
                if n < RESERVOIR:
                    reservoir.append(text)
                else:  # reservoir sampling: every new document so far equally likely to be held
                    j = rng.randrange(n + 1)
                    if j < RESERVOIR:
                        reservoir[j] = text
            counts[what] += 1
            if out is None:
                out = gzip.open(folder / f"part-{files:05d}.jsonl.gz", "wb", compresslevel=1)
                files += 1
            size = len(text.encode("utf-8", "surrogatepass"))
            buf.append((json.dumps({"id": f"scale-{docs:09d}", "text": text}, ensure_ascii=False) + "\n")
                       .encode("utf-8", "surrogatepass"))
            total += size
            in_file += size
            docs += 1
            if len(buf) >= 2048 or in_file >= file_bytes:
                out.write(b"".join(buf))
                buf = []
            if in_file >= file_bytes:
                out.close()
                out, in_file = None, 0
        if buf:
            out.write(b"".join(buf))
    finally:
        if out is not None:
            out.close()
    return Corpus(folder, files, docs, total, counts["new"], counts["exact"], counts["near"],
                  time.perf_counter() - t0)


# ---------------------------------------------------------------- the job


def job_spec(corpus: Path, out: Path, name: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "name": name,
        "inputs": [{"path": str(corpus / "*.jsonl.gz"), "format": "jsonl"}],
        "stages": [
            {"type": "normalize"},
            {"type": "lid"},  # languages unset: every language kept, low_score (< 0.65) dropped
            {"type": "gopher_repetition"},
            {"type": "gopher_quality"},
            {"type": "c4"},
            {"type": "fineweb"},
            {"type": "pii"},  # mode redact (default)
            {"type": "exact_dedup"},
            {"type": "near_dedup", "params": {"threshold": args.near_threshold}},
        ],
        "tokenizer": {"train": {"vocab_size": args.vocab}},
        "packing": {"seq_len": args.seq_len},
        "output": {"path": str(out), "rejected_sample": args.rejected_sample},
        "execution": {"parallelism": args.parallelism},
    }


CLK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36


CALIBRATION_DOCS = 20_000


def calibrate(corpus: Path) -> dict[str, Any]:
    """This machine's speed today, as one fixed piece of work: fastText's own ``predict`` (lid.176.ftz, k=1,
    batches of 256, one thread) on the first 20,000 documents of the smallest corpus (the corpus is seeded, so
    they are the same documents on every run), best CPU-seconds of three. The machine's speed varies widely
    between runs; a run's figures are read against this one, not against another run's."""
    from pipeline.filters.fasttext_model import FastTextModel, default_lid_model

    texts: list[str] = []
    for path in sorted(corpus.glob("*.jsonl.gz")):
        for rec in iter_jsonl(path):
            texts.append(str(rec.get("text") or ""))
            if len(texts) >= CALIBRATION_DOCS:
                break
        if len(texts) >= CALIBRATION_DOCS:
            break
    model = FastTextModel(default_lid_model())
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        for i in range(0, len(texts), 256):
            model.predict(texts[i : i + 256], k=1)
        best = min(best, time.process_time() - t)
    return {"what": f"fastText lid.176.ftz predict on the first {len(texts):,} documents of the smallest corpus, "
                    "best of 3", "docs": len(texts), "cpu_s": round(best, 2)}


def become_subreaper() -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children_cpu() -> float:
    """CPU-seconds of this process's reaped children (and what they reaped)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def read_stats() -> dict[int, tuple[int, int, int, int]]:
    """``pid -> (ppid, start time, utime+stime, cutime+cstime)`` (clock ticks) of every process of the machine."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rindex(b")") + 2:].split()
        out[int(name)] = (int(rest[1]), int(rest[19]), int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14]))
    return out


def proc_memory(pid: int) -> tuple[int, int]:
    """``(VmHWM, RssAnon)`` of ``pid`` in KiB (0 for a zombie or a process gone)."""
    hwm = anon = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    hwm = int(line.split()[1])
                elif line.startswith(b"RssAnon:"):
                    anon = int(line.split()[1])
    except OSError:
        pass
    return hwm, anon


def proc_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    if not words:
        return "?"
    if words[0].startswith("ray::"):
        return words[0].split()[0].removesuffix(".__init__")
    if "-m" in words:  # python -m service.cli run ...
        return " ".join(words[words.index("-m") + 1:][:2])
    return Path(words[0]).name


def du_bytes(path: Path, files: dict[str, int] | None = None) -> int:
    """Allocated bytes under ``path`` (what ``du`` counts); ``files`` gets each file's largest size seen."""
    total = 0
    stack = [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif files is not None:
                        files[entry.path] = max(files.get(entry.path, 0), st.st_size)
        except OSError:
            continue
    return total


def ray_temp_root() -> Path:
    """Where a local Ray puts its sessions (Ray's own rule: RAY_TMPDIR, else TMPDIR on Linux, else /tmp)."""
    base = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return Path(base) / "ray"


@dataclass
class Proc:
    """One process of the job's tree as last seen (ticks are clock ticks)."""

    pid: int
    ppid: int
    name: str
    ticks: int = 0  # its own utime+stime
    child_ticks: int = 0  # cutime+cstime: what it reaped
    extra: int = 0  # CPU of its reaped children not seen in their own samples (their last moments, short lives)
    new_child_ticks: int = 0  # cutime+cstime of the sample being taken
    rate: float = 0.0  # its CPU-seconds per second over the last interval
    alive: bool = True
    hwm_kb: int = 0
    anon_kb: int = 0


@dataclass
class Tree:
    """Every process below this one, sampled; the CPU-seconds of the tree so far at each sample.

    A process's CPU is its own utime+stime as last seen; when one exits, its parent's cutime+cstime (or this
    process's RUSAGE_CHILDREN) grows by its final figures, and what that growth holds beyond the last sample of
    the children that left is added too. Ray's raylet ignores SIGCHLD (its workers are reaped by the kernel and
    their time is counted nowhere), so a worker's last moments (at most one interval each) are unseen: bounded in
    ``tail_bound_s`` by the rate of its last interval."""

    interval: float
    procs: dict[tuple[int, int], Proc] = field(default_factory=dict)
    series: list[tuple[float, float]] = field(default_factory=list)  # (time.time(), tree CPU-seconds)
    tail_bound_s: float = 0.0
    max_alive: int = 0
    me_extra: int = 0
    _me_cpu: float = field(default_factory=children_cpu)
    _last_t: float = 0.0

    def _reaped(self, children: list[Proc], grown: int) -> int:
        """A parent whose cutime+cstime grew by ``grown`` ticks while ``children`` left: the ticks to add beyond
        their last samples. Grown less than they held: not reaped by it (the kernel did, the parent ignoring
        SIGCHLD): their last moments are unseen, at most one interval at their last rate each."""
        left = sum(c.ticks + c.child_ticks + c.extra for c in children)
        if children and grown < left:
            self.tail_bound_s += sum(c.rate for c in children) * self.interval
        return max(0, grown - left)

    def sample(self) -> int:
        """Take one sample; returns the processes alive in the tree."""
        me = os.getpid()
        now = time.time()
        stats = read_stats()
        kids: dict[int, list[int]] = {}
        for pid, (ppid, _, _, _) in stats.items():
            kids.setdefault(ppid, []).append(pid)
        tree, stack = [], [me]
        while stack:
            for pid in kids.get(stack.pop(), ()):
                tree.append(pid)
                stack.append(pid)
        dt = now - self._last_t if self._last_t else self.interval
        seen = set()
        for pid in tree:
            ppid, start, ticks, cticks = stats[pid]
            key = (pid, start)
            seen.add(key)
            p = self.procs.get(key)
            if p is None:
                p = self.procs[key] = Proc(pid, ppid, proc_name(pid))
            p.rate = (ticks - p.ticks) / CLK / dt if p.ticks else ticks / CLK / dt
            p.ppid, p.ticks = ppid, ticks
            hwm, anon = proc_memory(pid)
            if hwm > p.hwm_kb or anon > p.anon_kb:
                if p.name in ("?", "python", "python3") or p.name.startswith("ray::IDLE"):
                    p.name = proc_name(pid)  # a Ray worker names itself when it takes work
                p.hwm_kb, p.anon_kb = max(p.hwm_kb, hwm), max(p.anon_kb, anon)
            p.new_child_ticks = cticks
        gone: dict[int, list[Proc]] = {}
        for key, p in self.procs.items():
            if p.alive and key not in seen:
                p.alive = False
                gone.setdefault(p.ppid, []).append(p)
        by_pid = {p.pid: p for key, p in self.procs.items() if key in seen}
        for p in by_pid.values():  # what each live parent reaped beyond its children's last samples
            new = p.new_child_ticks
            p.extra += self._reaped(gone.pop(p.pid, []), new - p.child_ticks)
            p.child_ticks = new
        mine = children_cpu()
        self.me_extra += self._reaped(gone.pop(me, []), round((mine - self._me_cpu) * CLK))
        self._me_cpu = mine
        for children in gone.values():  # their parent left too: what they did after their last sample is unseen
            self._reaped(children, 0)
        self.series.append((now, (sum(p.ticks + p.extra for p in self.procs.values()) + self.me_extra) / CLK))
        self.max_alive = max(self.max_alive, len(tree))
        self._last_t = now
        return len(tree)


@dataclass
class Watch:
    """What was seen of one run besides the process tree."""

    spill_files: dict[str, int] = field(default_factory=dict)
    work_peak: int = 0
    spill_peak: int = 0
    disk_peak: int = 0
    session: Path | None = None


def run_job(spec_path: Path, out: Path, log_dir: Path, args: argparse.Namespace
            ) -> tuple[int, float, float, Tree, int, Watch, int]:
    """Run the job as a child; returns (exit code, launch time, exit time, its process tree, the driver's pid,
    what else was seen, stragglers killed)."""
    tree = Tree(args.interval)
    watch = Watch()
    t_launch = time.time()
    tree.series.append((t_launch, 0.0))
    with open(log_dir / "stdout.log", "wb") as so, open(log_dir / "stderr.log", "wb") as se:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", "run", str(spec_path)], cwd=REPO,
                                stdout=so, stderr=se, stdin=subprocess.DEVNULL)
    child, status, t_exit = proc.pid, None, 0.0
    next_du = 0.0
    work = out / ".tokenmill" / "work"
    grace_until = None
    stragglers = 0
    while True:
        while True:  # reap everything that reached this process (the child, orphans of the job)
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
            if pid == child:
                status, t_exit = os.waitstatus_to_exitcode(st), time.time()
                proc.returncode = status  # reaped here: Popen must not wait for it again
        alive = tree.sample()
        now = time.time()
        if watch.session is None:
            found = sorted(ray_temp_root().glob(f"session_*_{child}"))
            watch.session = found[-1] if found else None
        if now >= next_du:
            next_du = now + args.du_every
            w = du_bytes(work)
            s = sum(du_bytes(d, watch.spill_files) for d in watch.session.glob("ray_spilled_objects*")) \
                if watch.session else 0
            watch.work_peak, watch.spill_peak = max(watch.work_peak, w), max(watch.spill_peak, s)
            watch.disk_peak = max(watch.disk_peak, w + s)
        if status is not None:
            if not alive:
                break
            if grace_until is None:
                grace_until = now + 30
            elif now > grace_until:  # processes of the job still alive 30 s after it exited: ours, end them
                for p in tree.procs.values():
                    if p.alive:
                        try:
                            os.kill(p.pid, signal.SIGKILL)
                            stragglers += 1
                        except ProcessLookupError:
                            pass
                grace_until = now + 3600
        time.sleep(args.interval)
    return int(status), t_launch, t_exit, tree, child, watch, stragglers


def read_events(out: Path) -> list[dict[str, Any]]:
    path = out / ".tokenmill" / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def phase_windows(events: list[dict[str, Any]], t_launch: float, t_exit: float) -> list[tuple[str, float, float]]:
    """``(phase, start, end)`` in time order, from the launch to the exit; gaps between phases are ``other``."""
    marks: list[tuple[str, float, float]] = []
    starting = next((e["ts"] for e in events if e["type"] == "ray_starting"), None)
    started = next((e["ts"] for e in events if e["type"] == "ray_started"), None)
    if starting is not None:
        marks.append(("startup", t_launch, starting))
        if started is not None:
            marks.append(("ray_start", starting, started))
    opened: dict[str, float] = {}
    for e in events:
        if e["type"] == "phase" and e["state"] == "started":
            opened[e["phase"]] = e["ts"]
        elif e["type"] == "phase" and e["state"] == "finished" and e["phase"] in opened:
            marks.append((e["phase"], opened.pop(e["phase"]), e["ts"]))
    marks.sort(key=lambda m: m[1])
    windows: list[tuple[str, float, float]] = []
    t = t_launch
    for name, a, b in marks:
        if a > t + 1e-3:
            windows.append(("other", t, a))
        windows.append((name, max(a, t), b))
        t = max(t, b)
    if t_exit > t:
        windows.append(("other", t, t_exit))
    return windows


def cpu_at(series: list[tuple[float, float]], t: float) -> float:
    """The tree's CPU-seconds at time ``t``, linear between samples."""
    i = bisect_left(series, (t, float("-inf")))
    if i <= 0:
        return series[0][1]
    if i >= len(series):
        return series[-1][1]
    (t0, c0), (t1, c1) = series[i - 1], series[i]
    return c0 + (c1 - c0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)


def raylet_spilled_mib(session: Path | None) -> tuple[int, int]:
    """The last ``Spilled N MiB`` and ``Restored N MiB`` of the raylet's log (0 when none)."""
    spilled = restored = 0
    log = session / "logs" / "raylet.out" if session else None
    if log and log.exists():
        with open(log, errors="replace") as f:
            for line in f:
                if "Spilled " in line or "Restored " in line:
                    m = re.search(r"(Spilled|Restored) (\d+) MiB", line)
                    if m and m.group(1) == "Spilled":
                        spilled = max(spilled, int(m.group(2)))
                    elif m:
                        restored = max(restored, int(m.group(2)))
    return spilled, restored


def measure(size_gb: float, corpus: Corpus, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    out = run_dir / "out"
    spec_path = run_dir / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(job_spec(corpus.folder, out, f"scale-{size_gb:g}gb".replace(".", "_"),
                                                 args), sort_keys=False))
    code, t_launch, t_exit, tree, driver_pid, watch, stragglers = run_job(spec_path, out, run_dir, args)
    if code != 0:
        err = (run_dir / "stderr.log").read_text(errors="replace")[-3000:]
        sys.exit(f"the job of {size_gb:g} GB failed (exit {code}); its output: {run_dir}\n{err}")
    events = read_events(out)
    stats = json.loads((out / "stats.json").read_text())
    gb = corpus.text_bytes / 1e9
    cpu_total = tree.series[-1][1]
    phases: dict[str, dict[str, float]] = {}
    for name, a, b in phase_windows(events, t_launch, t_exit):
        p = phases.setdefault(name, {"s": 0.0, "cpu_s": 0.0})
        p["s"] += b - a
        p["cpu_s"] += cpu_at(tree.series, b) - cpu_at(tree.series, a)
    for p in phases.values():
        p.update(s=round(p["s"], 2), cpu_s=round(p["cpu_s"], 1), s_per_gb=round(p["s"] / gb, 1),
                 cpu_s_per_gb=round(p["cpu_s"] / gb, 1))
    wall = t_exit - t_launch
    driver = next((p for p in tree.procs.values() if p.pid == driver_pid), None)
    biggest = max(tree.procs.values(), key=lambda p: p.hwm_kb)
    biggest_anon = max(tree.procs.values(), key=lambda p: p.anon_kb)
    spill_log_mib, restored_mib = raylet_spilled_mib(watch.session)
    spilled = max(sum(watch.spill_files.values()), spill_log_mib * 1024 * 1024)
    stages = {s["stage"]: s for s in stats.get("stages", [])}
    dropped = {k: {r: n for r, n in (s.get("dropped") or {}).items()} for k, s in stages.items()}
    return {
        "size_gb": size_gb, "gb": round(gb, 4), "files": corpus.files, "docs": corpus.docs,
        "planned": {"new": corpus.new_docs, "exact_copies": corpus.exact_copies, "near_copies": corpus.near_copies},
        "build_s": round(corpus.build_s, 1),
        "wall_s": round(wall, 1), "s_per_gb": round(wall / gb, 1),
        "cpu_s": round(cpu_total, 1), "cpu_s_per_gb": round(cpu_total / gb, 1),
        "cpu_tail_bound_s": round(tree.tail_bound_s, 1), "cores_busy": round(cpu_total / wall, 2) if wall > 0 else None,
        "phases": phases,
        "driver_peak_rss_mb": round(driver.hwm_kb / 1024, 1) if driver else None,
        "driver_peak_anon_mb": round(driver.anon_kb / 1024, 1) if driver else None,
        "max_rss_mb": round(biggest.hwm_kb / 1024, 1), "max_rss_process": biggest.name,
        "max_anon_mb": round(biggest_anon.anon_kb / 1024, 1), "max_anon_process": biggest_anon.name,
        "processes_seen": len(tree.procs), "processes_at_once": tree.max_alive, "stragglers_killed": stragglers,
        "spilled_mb": round(spilled / 1e6, 1), "spilled_log_mib": spill_log_mib, "restored_log_mib": restored_mib,
        "spill_dir_peak_mb": round(watch.spill_peak / 1e6, 1), "work_peak_mb": round(watch.work_peak / 1e6, 1),
        "disk_peak_mb": round(watch.disk_peak / 1e6, 1), "output_mb": round(du_bytes(out) / 1e6, 1),
        "rejected_mb": round(du_bytes(out / "rejected") / 1e6, 1),
        "ray_session": watch.session.name if watch.session else None,
        "docs_kept": stats.get("packing", {}).get("docs"),
        "tokens": stats.get("output", {}).get("tokens"), "shards": stats.get("output", {}).get("shards"),
        "stages": {k: {"docs_in": s.get("docs_in"), "docs_out": s.get("docs_out"), "seconds": s.get("seconds")}
                   for k, s in stages.items()},
        "dropped": dropped, "coverage": stats.get("coverage"),
    }


# ---------------------------------------------------------------- report

PHASE_ORDER = ("startup", "ray_start", "curate", "tokenizer", "write", "finalize", "other")


def print_size(r: dict[str, Any]) -> None:
    p = r["planned"]
    dedup = {k: sum(v.values()) for k, v in r["dropped"].items() if k.endswith("exact_dedup") or
             k.endswith("near_dedup")}
    print(f"\n== {r['size_gb']:g} GB: {r['gb'] * 1000:.1f} MB of text, {r['docs']:,} docs in {r['files']} files "
          f"(built in {r['build_s']:.1f} s; planned copies {p['exact_copies']:,} exact + {p['near_copies']:,} near; "
          f"dedup dropped {', '.join(f'{k} {v:,}' for k, v in dedup.items())}); kept {r['docs_kept']:,} docs, "
          f"{r['tokens']:,} tokens, {r['shards']} shards")
    print(f"{'phase':<10} {'wall s':>8} {'s/GB':>9} {'CPU-s':>9} {'CPU-s/GB':>10} {'cores':>6}")
    names = [n for n in PHASE_ORDER if n in r["phases"]] + [n for n in r["phases"] if n not in PHASE_ORDER]
    for n in names:
        ph = r["phases"][n]
        cores = f"{ph['cpu_s'] / ph['s']:.2f}" if ph["s"] >= 0.5 else "-"  # a phase this short: sampling noise
        print(f"{n:<10} {ph['s']:>8.1f} {ph['s_per_gb']:>9.1f} {ph['cpu_s']:>9.1f} {ph['cpu_s_per_gb']:>10.1f} "
              f"{cores:>6}")
    print(f"{'total':<10} {r['wall_s']:>8.1f} {r['s_per_gb']:>9.1f} {r['cpu_s']:>9.1f} {r['cpu_s_per_gb']:>10.1f} "
          f"{r['cores_busy']:>6.2f}")
    print(f"driver peak RSS {r['driver_peak_rss_mb']:.0f} MB (anon {r['driver_peak_anon_mb']:.0f}); largest process "
          f"{r['max_rss_mb']:.0f} MB ({r['max_rss_process']}), largest private {r['max_anon_mb']:.0f} MB "
          f"({r['max_anon_process']}); {r['processes_seen']} processes, {r['processes_at_once']} at once; "
          f"spilled {r['spilled_mb']:.0f} MB (raylet log {r['spilled_log_mib']} MiB); disk peak work "
          f"{r['work_peak_mb']:.0f} MB + spill {r['spill_dir_peak_mb']:.0f} MB (together {r['disk_peak_mb']:.0f} MB), "
          f"output {r['output_mb']:.0f} MB; CPU unseen (last moments of processes reaped by the kernel) "
          f"<= {r['cpu_tail_bound_s']:.1f} s")
    drops = "; ".join(f"{k} " + ", ".join(f"{reason} {n:,}" for reason, n in v.items())
                      for k, v in r["dropped"].items() if v)
    print(f"drops: {drops}")


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return slope, my - slope * mx


def summary(records: list[dict[str, Any]], sizes: list[float]) -> dict[str, Any]:
    small, large = records[0], records[-1]
    slope, intercept = fit([r["gb"] for r in records], [r["cpu_s"] for r in records])

    def ratio(key: str) -> float | None:
        return round(large[key] / small[key], 3) if small.get(key) and large.get(key) is not None else None

    return {
        "bench": "scale", "sizes_gb": sizes, "per_size": records,
        "growth": ratio("s_per_gb"), "driver_rss_growth": ratio("driver_peak_rss_mb"),
        "max_rss_growth": ratio("max_anon_mb"), "max_hwm_growth": ratio("max_rss_mb"),
        "core_hours_per_tb": round(large["cpu_s_per_gb"] * 1000 / 3600, 1),
        "cost_slope": {"slope": round(slope, 1), "intercept": round(intercept, 1)},
        "spilled_gb": round(large["spilled_mb"] / 1000, 3),
    }


SIZE_FIGURES = ("s_per_gb", "cpu_s_per_gb", "cores_busy", "driver_peak_rss_mb", "max_anon_mb", "spilled_mb",
                "output_mb", "rejected_mb", "docs_kept", "tokens")


def figures(result: dict[str, Any]) -> dict[str, Any]:
    """What bench/RESULTS.md shows: the totals, then per corpus size its costs, memory and output, and each
    stage's worker-seconds per GB (the stages' shares of the chain's cost)."""
    out: dict[str, Any] = {k: result.get(k) for k in ("core_hours_per_tb", "growth", "driver_rss_growth",
                                                       "max_rss_growth", "spilled_gb", "rejected_sample")}
    out["calibration_cpu_s"] = result.get("calibration", {}).get("cpu_s")
    for rec in result["per_size"]:
        size = f"{rec['gb']:g} GB"
        out.update({f"{size} {k}": rec[k] for k in SIZE_FIGURES if k in rec})
        out.update({f"{size} coverage.{k}": v for k, v in rec.get("coverage", {}).items()})
        out.update({f"{size} stage_s_per_gb.{name.split('-', 1)[-1]}": round(st["seconds"] / rec["gb"], 1)
                    for name, st in rec.get("stages", {}).items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="0.25,1,4", help="comma list of corpus sizes in GB of text (1e9 bytes)")
    ap.add_argument("--work", type=Path, help="folder for corpora and outputs (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (default: deleted at the end)")
    ap.add_argument("--data", type=Path, default=CORPORA, help="the shared corpora (default: ../shared/corpora)")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the result here instead of bench/results/scale_<machine>.json")
    ap.add_argument("--variant", help="record the result as this named variant of the file (another setting)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--file-mb", type=float, default=128.0, help="largest input file, MB of text")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--near-threshold", type=float, default=0.7)
    ap.add_argument("--rejected-sample", type=float, default=1.0,
                    help="output.rejected_sample: the share of drops written to rejected/ (counts stay exact)")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples of the process tree")
    ap.add_argument("--du-every", type=float, default=1.0, help="seconds between disk samples")
    args = ap.parse_args()
    sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or any(s <= 0 for s in sizes):
        sys.exit("--sizes: positive GB values, e.g. 0.25,1,4")
    if not become_subreaper():
        print("warning: cannot become a child subreaper: CPU of processes orphaned by the job is lost",
              file=sys.stderr)
    created = args.work is None or not args.work.exists()
    work = args.work or Path(tempfile.mkdtemp(prefix="tm-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    records = []
    made: list[Path] = []  # what this run wrote into the work folder (a given --work may hold other things)
    try:
        t0 = time.perf_counter()
        pools = load_pools(args.data)
        print(f"pools in {time.perf_counter() - t0:.1f} s: {pools.summary()}", flush=True)
        corpora = []
        for size in sorted(sizes):  # every corpus first: the pools (~300 MB) are freed before the first job
            target = int(size * 1e9)
            file_bytes = int(min(args.file_mb * 1e6, max(1e6, target / (2 * args.parallelism))))
            made.append(work / f"corpus-{size:g}gb")
            corpus = build_corpus(made[-1], target, file_bytes, pools, args.seed)
            corpora.append((size, corpus))
            print(f"{size:g} GB: built {corpus.text_bytes / 1e6:.1f} MB of text, {corpus.docs:,} docs in "
                  f"{corpus.files} files in {corpus.build_s:.1f} s ({corpus.text_bytes / 1e6 / corpus.build_s:.0f} "
                  f"MB/s)", flush=True)
        del pools
        gc.collect()
        calibration = calibrate(corpora[0][1].folder)
        print(f"calibration: {calibration['cpu_s']} CPU-s ({calibration['what']})", flush=True)
        for size, corpus in corpora:
            run_dir = work / f"run-{size:g}gb"
            made.append(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            print(f"{size:g} GB: running the job ({run_dir / 'spec.yaml'})...", flush=True)
            rec = measure(size, corpus, run_dir, args)
            records.append(rec)
            print_size(rec)
            if not args.keep:
                shutil.rmtree(corpus.folder, ignore_errors=True)
                shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        if args.keep:
            print(f"work folder kept: {work}")
        elif created:
            shutil.rmtree(work, ignore_errors=True)
        else:
            for path in made:
                shutil.rmtree(path, ignore_errors=True)
    print(f"\n{'size GB':>8} {'s/GB':>8} {'CPU-s/GB':>9} {'cores':>6} {'driver RSS MB':>14} {'max RSS MB':>11} "
          f"{'spilled MB':>11} {'disk peak MB':>13}")
    for r in records:
        print(f"{r['size_gb']:>8g} {r['s_per_gb']:>8.1f} {r['cpu_s_per_gb']:>9.1f} {r['cores_busy']:>6.2f} "
              f"{r['driver_peak_rss_mb']:>14.0f} {r['max_rss_mb']:>11.0f} {r['spilled_mb']:>11.0f} "
              f"{r['disk_peak_mb']:>13.0f}")
    result = summary(records, sorted(sizes))
    result["rejected_sample"] = args.rejected_sample
    result["calibration"] = calibration
    emit_json(result, args.json, figures=figures(result), variant=args.variant)


if __name__ == "__main__":
    main()
