"""The benchmark index: every benchmark text's n-gram keys, with their positions, in one sorted uint64 array.

Built once per job on the driver (``Decontaminate.prepare``) and shipped to the workers as plain data
(:meth:`BenchmarkIndex.to_plain`: numpy arrays and lists of strings, ~35 MB for GSM8K + HumanEval + MMLU +
TruthfulQA), so a worker's only set-up is a dict of the vocabulary and a bit filter.

**What is indexed.** Every text field of a record (``prompt``, ``canonical_solution``, ``question``,
``answer``, MMLU's ``choices``, TruthfulQA's answers...) but ids, metadata and HumanEval's ``test`` harness
(:data:`DEFAULT_EXCLUDE_FIELDS`), each as a text of its own, and the fields laid end to end (:func:`unit_words`):
a page may hold the solution alone, the question alone, or half of the whole item. Before, only ``text``,
``question`` and ``prompt`` were read, and a copied solution or answer was never found.

**Items shorter than ``ngram`` words.** 29 % of MMLU's and 75 % of TruthfulQA's questions have fewer than
13 words and would have no 13-gram at all, so an item of fewer than ``ngram`` words is one gram, its whole
word sequence (looked up by its first ``min_words`` words, then compared whole), provided that it

- has at least ``min_words`` words that hold a letter: "Who are you?", "Inflation" or "8 + 8 ÷ 2 + 2 ="
  are everyday phrases or arithmetic, not evidence of a leak (counted in :attr:`BenchmarkIndex.skipped`);
- is not a stock question: one whose words occur, in order, in ``stock_items`` or more benchmark items
  ("Which of the following is true?" is the whole text of 8 MMLU items and part of 113 more), which
  would match every quiz page (counted in :attr:`BenchmarkIndex.stock`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.decontam.ngrams import Prefix, word_values, words
from pipeline.documents import is_blank
from pipeline.readers.docs import record_id
from pipeline.readers.jsonl import iter_records
from pipeline.readers.paths import detect_format, expand_path

#: GPT-3's contamination n-gram (Brown et al. 2020, appendix C; also lm-evaluation-harness's decontamination)
DEFAULT_NGRAM = 13
#: fewest words (holding a letter) of an item shorter than ``ngram``: 4 keeps 99.5 % of the items spliced
#: into the shared ``bench/contamination_probe`` set (5 keeps 98.7 %, GPT-3's floor of 8 keeps 92 %) while
#: a 1-3 word item ("Are toads frogs?") is an everyday phrase (measured by ``bench/eval_decontam.py``)
DEFAULT_MIN_WORDS = 4
#: a short item found in this many benchmark items is a stock question: on MMLU + TruthfulQA + GSM8K +
#: HumanEval, 2 is an exact duplicate (164 items, e.g. the same question under two subjects) and every
#: short item in 3 or more is a "which of the following ..." stem (measured, see the module docstring)
DEFAULT_STOCK_ITEMS = 3
#: fewest words (holding a letter) of a short text that is not the item's first (its question): an answer
#: or a list of choices of 4-7 words is a list of everyday words ("Wednesday Thursday Friday Saturday" is
#: the choices of two MMLU items and part of every calendar); 8 is GPT-3's shortest contamination n-gram
MIN_ANSWER_WORDS = 8
#: a window with fewer words holding a letter is a table row ("1 1 1 1 1 1 ..." of an MMLU matrix, found
#: in a C header's table of ones): it counts for an item's overlap, never for a span. 1, not more: a
#: HumanEval doctest line (``>>> f([1, 20, 4, 10], 5)``) is mostly numbers and is the item's own
SPAN_LETTER_WORDS = 1
#: a window found in this many items is a stock phrase: it counts for an item's overlap, never for a span.
#: In MMLU a reading passage is shared by at most 6 items (the 13-grams of 2-6 items are such passages,
#: which a page can copy); the windows of 7 or more are stems ("...according to ordinary moral standards in
#: the US as of 2020", 895 items; "then using the truth table determine whether the argument is valid")
DEFAULT_COMMON_ITEMS = 7


#: record fields that are never an item's text: ids, labels and metadata, and HumanEval's ``test`` harness
#: (``check(candidate)`` code shared by many items). Every other string field, and every list of strings
#: (MMLU's ``choices``), is indexed by default (``text_fields: null``)
DEFAULT_EXCLUDE_FIELDS = ("id", "benchmark", "split", "subject", "category", "entry_point", "test", "task_id",
                          "source", "url", "license", "type", "level", "difficulty", "language", "lang", "tags")
#: the name of the unit made of an item's fields laid end to end (prompt + solution, question + choices)
WHOLE_ITEM = "item"


@dataclass(frozen=True)
class Item:
    """One benchmark item as read from a benchmark file: its texts, each with the field it came from.

    ``text`` is the first text and ``extra`` the others; ``fields`` names them (``text`` when not given).
    """

    benchmark: str
    id: str
    text: str
    extra: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()

    @property
    def units(self) -> list[tuple[str, str]]:
        """``(field, text)`` of every text of the item, in order (the index keeps one of equal texts)."""
        names = self.fields or ("text",) * (1 + len(self.extra))
        return list(zip(names, (self.text, *self.extra), strict=False))


@dataclass
class BenchmarkIndex:
    """Gram keys of every indexed text, and where each key sits (CSR: ``offsets`` -> ``owners``/``owner_pos``).

    Items are numbered in file order (``item_*``, every item read); each indexed text of an item (a field,
    or the whole item) is a *unit* of its own (``text_*``; ``text_item`` names its item, ``text_field`` its
    field in ``fields``). A long text's keys are its ``ngram``-word windows, each with its position in the
    text (so a document's run of consecutive windows is a span of the item); a short text (fewer than
    ``ngram`` words) has one key, its first ``min_words`` words (its *head*), and is confirmed by
    ``text_full`` where the head is found. So a document is hashed at two lengths only.
    """

    ngram: int
    min_words: int
    stock_items: int
    common_items: int
    vocab: list[str]
    keys: np.ndarray  # uint64, sorted, unique
    offsets: np.ndarray  # int64, len(keys) + 1
    owners: np.ndarray  # int32 text numbers, grouped by key
    owner_pos: np.ndarray  # int32: the window's position in that text (0 for a short text's head)
    #: bool per key: never part of a span, as a stock phrase (in ``common_items`` or more items) or a table
    #: row (fewer than SPAN_LETTER_WORDS words holding a letter)
    common: np.ndarray
    text_item: np.ndarray  # int32: the item of each indexed text
    text_field: np.ndarray  # int16: index into ``fields``
    text_grams: np.ndarray  # int32: windows of each text (1 for a short text)
    text_words: np.ndarray  # int32: normalized words of each text
    text_full: np.ndarray  # uint64: key of the text's whole word sequence (exact matches)
    item_bench: np.ndarray  # int16: index into ``benchmarks``
    item_ids: list[str]
    benchmarks: list[str]
    fields: list[str]
    #: per benchmark, items left out (no text indexed) for having fewer than ``min_words`` words with a letter
    skipped: dict[str, int] = field(default_factory=dict)
    #: per benchmark, items left out as stock questions
    stock: dict[str, int] = field(default_factory=dict)

    def items_per_benchmark(self) -> dict[str, int]:
        """Indexed items of each benchmark (every benchmark named, even with none indexed)."""
        counts = np.bincount(self.item_bench[np.unique(self.text_item)], minlength=len(self.benchmarks))
        return {b: int(counts[i]) for i, b in enumerate(self.benchmarks)}

    def to_plain(self) -> dict[str, Any]:
        """What ``prepare()`` returns: plain arrays, lists and numbers (no class to unpickle on a worker)."""
        return asdict(self)

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> BenchmarkIndex:
        return cls(**data)


# ---- reading benchmark files ----------------------------------------------------------------------------

def benchmark_files(paths: Iterable[str]) -> list[str]:
    """The files that ``paths`` (files, folders, globs) name, in order, each once."""
    seen: dict[str, None] = {}
    for path in paths:
        for f in expand_path(path):
            seen.setdefault(f, None)
    return list(seen)


def default_benchmark_name(path: str) -> str:
    """``gsm8k_test`` for ``.../gsm8k_test.jsonl.gz``: the file name less its format and compression."""
    name = os.path.basename(path)
    for suffix in (".gz", ".zst", ".zstd"):
        name = name.removesuffix(suffix)
    for suffix in (".jsonl", ".ndjson", ".json", ".parquet"):
        name = name.removesuffix(suffix)
    return name


def item_texts(record: dict[str, Any], text_fields: Iterable[str] | None = None,
               exclude: Iterable[str] = DEFAULT_EXCLUDE_FIELDS) -> list[tuple[str, str]]:
    """``(field, text)`` of a benchmark record's texts.

    The fields are ``text_fields`` in that order, or (None) every field of the record but ``exclude``; a
    list of strings (MMLU's ``choices``) is one text, its strings a line each; a one-word value (MMLU's
    ``answer: B``, a bare number) is a label, not a text. The index adds the fields laid end to end
    (:func:`unit_words`).
    """
    skip = set(exclude)
    names = list(text_fields) if text_fields is not None else [k for k in record if k not in skip]
    out: list[tuple[str, str]] = []
    for name in names:
        value = record.get(name)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            value = "\n".join(value)
        if isinstance(value, str) and not is_blank(value) and len(value.split(None, 1)) > 1:
            out.append((name, value))
    return out


def unit_words(fields: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """The item's texts as words: its fields, then the fields other than ``text`` laid end to end (the
    whole item: prompt + solution, question + choices + answer) and, with three such fields or more, the
    first one followed by each other one (``question+best_answer``: a page may show the question with one
    answer only). Built from the fields' words: a line break between two texts is no word, so these are
    the words of the joined texts."""
    parts = [(name, ws) for name, ws in fields if name != "text"]
    out = list(fields)
    if len(parts) >= 2:
        out.append((WHOLE_ITEM, [w for _, ws in parts for w in ws]))
    if len(parts) >= 3:
        first, question = parts[0]
        out.extend((f"{first}+{name}", question + ws) for name, ws in parts[1:])
    return out


def read_items(paths: Iterable[str], text_fields: Iterable[str] | None = None, id_field: str = "id",
               benchmark_field: str = "benchmark", bad: Counter | None = None,
               exclude_fields: Iterable[str] = DEFAULT_EXCLUDE_FIELDS) -> Iterator[Item]:
    """Every item of the benchmark files (JSONL, plain or compressed, or Parquet) in ``paths``.

    The item's texts are :func:`item_texts` (every text field but ``exclude_fields``, or ``text_fields``).
    The benchmark is the record's ``benchmark_field`` when it is a string, else the file's name; the id is
    the record's ``id_field`` (``name:line`` without one, as for any input). A record that cannot be read or
    has no text is counted in ``bad`` under the readers' reason (``bad_json``, ``missing_text``...).
    """
    exclude = (*exclude_fields, id_field, benchmark_field)
    for i, path in enumerate(benchmark_files(paths)):
        fmt = detect_format(path, "auto")
        name = os.path.basename(path)
        if fmt == "jsonl":
            records: Iterable[Any] = iter_records(i, path, name)
        elif fmt == "parquet":
            records = _parquet_records(path)
        else:
            raise ValueError(f"{name}: a benchmark file must be JSONL (.jsonl, .jsonl.gz, .jsonl.zst) or Parquet")
        fallback = default_benchmark_name(path)
        for rec in records:
            if not isinstance(rec, tuple):  # a Drop from the JSONL reader
                if bad is not None:
                    bad[rec.reason] += 1
                continue
            n, _, record = rec
            texts = item_texts(record, text_fields, exclude)
            if not texts:
                if bad is not None:
                    bad["missing_text"] += 1
                continue
            bench = record.get(benchmark_field)
            yield Item(bench if isinstance(bench, str) and bench else fallback,
                       record_id(record, id_field, name, n), texts[0][1], tuple(t for _, t in texts[1:]),
                       tuple(f for f, _ in texts))


def _parquet_records(path: str) -> Iterator[tuple[int, None, dict[str, Any]]]:
    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            yield n, None, row
            n += 1


# ---- building ---------------------------------------------------------------------------------------------

def build_index(items: Iterable[Item], ngram: int = DEFAULT_NGRAM, min_words: int = DEFAULT_MIN_WORDS,
                stock_items: int = DEFAULT_STOCK_ITEMS, common_items: int = DEFAULT_COMMON_ITEMS) -> BenchmarkIndex:
    """Hash every item text's grams with their positions (vectorized over the concatenated texts)."""
    if not 1 <= min_words <= ngram:
        raise ValueError(f"min_words must be in 1..ngram ({ngram}), got {min_words}")
    units = _Units.of(items, min_words)
    h = _Hashed.of(units.words)
    bench = np.array(units.item_bench, dtype=np.int16)
    owner_item = np.array(units.text_item, dtype=np.int64)
    n_words, n_items = h.n_words, len(units.item_ids)
    n_letter = h.letters[h.starts + n_words] - h.letters[h.starts]

    short = n_words < ngram
    too_short = (n_letter < np.array(units.floor, dtype=np.int64)) & short
    candidates = short & ~too_short
    stock = candidates & (_items_holding(h.prefix, h.starts, n_words, h.full, candidates, owner_item) >= stock_items)
    kept = np.flatnonzero(~too_short & ~stock)
    keys, offsets, owner, pos, common = _key_table(h, kept, owner_item[kept], n_items, ngram, min_words, common_items)
    used = np.unique(h.ids[_positions(h.starts[kept], n_words[kept])])
    # an item none of whose texts is indexed: a stock question when one of them was one, else too short
    left_out = np.ones(n_items, dtype=bool)
    left_out[owner_item[kept]] = False
    was_stock = np.zeros(n_items, dtype=bool)
    was_stock[owner_item[stock]] = True
    return BenchmarkIndex(
        ngram=ngram, min_words=min_words, stock_items=stock_items, common_items=common_items,
        # words of left-out texts only are unknown to the matcher: their windows are never hashed
        vocab=_only(h.vocab, used),
        keys=keys, offsets=offsets, owners=owner.astype(np.int32), owner_pos=pos.astype(np.int32), common=common,
        text_item=owner_item[kept].astype(np.int32),
        text_field=np.array(units.text_field, dtype=np.int16)[kept],
        text_grams=np.where(n_words[kept] >= ngram, n_words[kept] - ngram + 1, 1).astype(np.int32),
        text_words=n_words[kept].astype(np.int32), text_full=h.full[kept], item_bench=bench,
        item_ids=units.item_ids, benchmarks=units.benchmarks, fields=units.fields,
        skipped=_per_bench(bench[left_out & ~was_stock], units.benchmarks),
        stock=_per_bench(bench[left_out & was_stock], units.benchmarks),
    )


@dataclass
class _Units:
    """The items' texts as words (:func:`unit_words`), each once per item, numbered in item order."""

    benchmarks: list[str] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)
    #: per item: its benchmark's number, its id
    item_bench: list[int] = field(default_factory=list)
    item_ids: list[str] = field(default_factory=list)
    #: per text: its item's number, its field's number, the fewest words holding a letter it needs, its words
    text_item: list[int] = field(default_factory=list)
    text_field: list[int] = field(default_factory=list)
    floor: list[int] = field(default_factory=list)
    words: list[list[str]] = field(default_factory=list)

    @classmethod
    def of(cls, items: Iterable[Item], min_words: int) -> _Units:
        u = cls()
        bench_no: dict[str, int] = {}
        field_no: dict[str, int] = {}
        for item in items:
            seen: set[tuple[str, ...]] = set()
            for k, (name, ws) in enumerate(unit_words([(f, words(t)) for f, t in item.units])):
                key = tuple(ws)
                if key in seen:  # GSM8K's text is its question + answer: one unit, under its first field
                    continue
                seen.add(key)
                u.text_item.append(len(u.item_ids))
                u.text_field.append(field_no.setdefault(name, len(field_no)))
                u.floor.append(min_words if k == 0 else max(min_words, MIN_ANSWER_WORDS))
                u.words.append(ws)
            u.item_bench.append(bench_no.setdefault(item.benchmark, len(bench_no)))
            u.item_ids.append(item.id)
        u.benchmarks, u.fields = list(bench_no), list(field_no)
        return u


@dataclass(frozen=True)
class _Hashed:
    """The texts' words laid end to end: word ids, prefix hashes, and where each text starts and ends."""

    vocab: list[str]
    ids: np.ndarray
    prefix: Prefix
    starts: np.ndarray
    n_words: np.ndarray
    #: words holding a letter before each position (one more entry than positions)
    letters: np.ndarray
    #: per text, the key of its whole word sequence
    full: np.ndarray

    @classmethod
    def of(cls, parsed: list[list[str]]) -> _Hashed:
        n_words = np.array([len(ws) for ws in parsed], dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(n_words)[:-1])).astype(np.int64) if parsed else n_words
        # word ids by Arrow's hash encoding (C speed; first-seen order, so the same items give the same ids)
        encoded = pa.array([w for ws in parsed for w in ws], type=pa.string()).dictionary_encode()
        ids = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        vocab = encoded.dictionary.to_pylist()
        prefix = Prefix(word_values(ids))
        has_letter = np.array([not w.isdigit() for w in vocab], dtype=np.int64)[ids]
        letters = np.concatenate(([0], np.cumsum(has_letter)))
        return cls(vocab, ids, prefix, starts, n_words, letters, prefix.windows(starts, n_words))


def _key_table(h: _Hashed, kept: np.ndarray, kept_item: np.ndarray, n_items: int, ngram: int, head: int,
               common_items: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (key, text, position) of the ``kept`` texts (``kept_item``: their items), grouped by key: a CSR from
    each distinct key to where it sits, as (keys, offsets, owners, positions, common per key)."""
    keys, owner, pos = _grams(h.prefix, h.starts[kept], h.n_words[kept], ngram, head)
    at = h.starts[kept][owner] + pos
    wordy = h.letters[np.minimum(at + ngram, len(h.ids))] - h.letters[at] >= SPAN_LETTER_WORDS
    order = np.lexsort((pos, owner, keys))
    keys, owner, pos, wordy = keys[order], owner[order], pos[order], wordy[order]
    uniq, first = np.unique(keys, return_index=True)
    offsets = np.append(first, len(keys)).astype(np.int64)
    # a key's items: distinct (key, item) pairs counted per key
    key_no = np.repeat(np.arange(len(uniq)), np.diff(offsets))
    pairs = np.unique(key_no * n_items + kept_item[owner]) if len(keys) else key_no
    items_per_key = np.bincount(pairs // max(n_items, 1), minlength=len(uniq))
    return uniq, offsets, owner, pos, (items_per_key >= common_items) | ~wordy[first]


def _positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Every word position of the given items in the concatenation."""
    return np.repeat(starts, lengths) + np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _grams(prefix: Prefix, starts: np.ndarray, n_words: np.ndarray, ngram: int, head: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(key, text, position)`` of every ``ngram`` window inside each long text, and of each short text's
    head (position 0)."""
    long = n_words >= ngram
    per_item = np.where(long, n_words - ngram + 1, 1)
    owner = np.repeat(np.arange(len(starts), dtype=np.int64), per_item)
    within = np.arange(len(owner)) - np.repeat(np.cumsum(per_item) - per_item, per_item)
    return prefix.windows(starts[owner] + within, np.where(long, ngram, head)[owner]), owner, within


def _items_holding(prefix: Prefix, starts: np.ndarray, n_words: np.ndarray, full: np.ndarray,
                   which: np.ndarray, item: np.ndarray) -> np.ndarray:
    """For each text in ``which``, how many items (its own included) have a text holding its word sequence."""
    df = np.zeros(len(starts), dtype=np.int64)
    for length in np.unique(n_words[which]):
        targets = np.flatnonzero(which & (n_words == length))
        sorted_keys = np.sort(full[targets])
        # every window of this length, in every item long enough to hold one
        fits = np.flatnonzero(n_words >= length)
        counts = n_words[fits] - length + 1
        owner = np.repeat(fits, counts)
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        keys = prefix.windows(starts[owner] + within, int(length))
        table = np.zeros(1 << 20, dtype=bool)  # prefilter on the top 20 bits: a 1 MB table stays in cache
        table[sorted_keys >> np.uint64(44)] = True
        maybe = np.flatnonzero(table[keys >> np.uint64(44)])
        pos = np.minimum(np.searchsorted(sorted_keys, keys[maybe]), len(sorted_keys) - 1)
        hit = maybe[sorted_keys[pos] == keys[maybe]]
        pairs = np.unique(np.stack([keys[hit], item[owner[hit]].astype(np.uint64)]), axis=1)  # one per (key, item)
        found, n = np.unique(pairs[0], return_counts=True)
        at = np.searchsorted(found, full[targets])
        ok = at < len(found)
        ok[ok] = found[at[ok]] == full[targets][ok]
        df[targets[ok]] = n[at[ok]]
    return df


def _only(vocab: list[str], used: np.ndarray) -> list[str]:
    """The vocabulary with words no indexed item uses blanked ("" is never a word), ids unchanged."""
    keep = np.zeros(len(vocab), dtype=bool)
    keep[used] = True
    return [w if k else "" for w, k in zip(vocab, keep, strict=True)]


def _per_bench(bench: np.ndarray, benchmarks: list[str]) -> dict[str, int]:
    counts = np.bincount(bench, minlength=len(benchmarks))
    return {b: int(counts[i]) for i, b in enumerate(benchmarks) if counts[i]}


def index_files(paths: Iterable[str], ngram: int = DEFAULT_NGRAM, min_words: int = DEFAULT_MIN_WORDS,
                stock_items: int = DEFAULT_STOCK_ITEMS, text_fields: Iterable[str] | None = None,
                id_field: str = "id", benchmark_field: str = "benchmark", bad: Counter | None = None,
                exclude_fields: Iterable[str] = DEFAULT_EXCLUDE_FIELDS, common_items: int = DEFAULT_COMMON_ITEMS
                ) -> BenchmarkIndex:
    """:func:`build_index` over the items of the benchmark files in ``paths``."""
    return build_index(read_items(paths, text_fields, id_field, benchmark_field, bad, exclude_fields), ngram,
                       min_words, stock_items, common_items)
