"""The benchmark index: every benchmark item's distinct n-gram keys in one sorted uint64 array.

Built once per job on the driver (``Decontaminate.prepare``) and shipped to the workers as plain data
(:meth:`BenchmarkIndex.to_plain`: numpy arrays and lists of strings, ~12 MB for GSM8K + HumanEval + MMLU +
TruthfulQA), so a worker's only set-up is a dict of the vocabulary and a bit filter.

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

from pipeline.decontam.ngrams import Prefix, word_values, words

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


#: record fields read as an item's texts, each present one indexed: ``text`` is the whole item in the shared
#: sets (GSM8K question + answer, HumanEval prompt + solution); ``question`` and ``prompt`` let a page that
#: holds only the question be found (alone, a GSM8K question is ~36 % of its item's 13-grams)
DEFAULT_TEXT_FIELDS = ("text", "question", "prompt")


@dataclass(frozen=True)
class Item:
    """One benchmark item as read from a benchmark file: its text, and other texts of it (its question)."""

    benchmark: str
    id: str
    text: str
    extra: tuple[str, ...] = ()

    @property
    def texts(self) -> list[str]:
        return list(dict.fromkeys((self.text, *self.extra)))


@dataclass
class BenchmarkIndex:
    """Gram keys of every indexed text, and which texts each key belongs to (CSR: ``offsets``/``owners``).

    Items are numbered in file order (``item_*``, every item read); each indexed text of an item (its
    ``text``, its ``question``...) is a unit of its own (``text_*``; ``text_item`` names its item). A long
    text's keys are its ``ngram``-word windows; a short text (fewer than ``ngram`` words) has one key, its
    first ``min_words`` words (its *head*), and is confirmed by ``text_full`` where the head is found. So a
    document is hashed at two lengths only, whatever the lengths of the short items.
    """

    ngram: int
    min_words: int
    stock_items: int
    vocab: list[str]
    keys: np.ndarray  # uint64, sorted, unique
    offsets: np.ndarray  # int64, len(keys) + 1
    owners: np.ndarray  # int32 text numbers, grouped by key
    text_item: np.ndarray  # int32: the item of each indexed text
    text_grams: np.ndarray  # int32: distinct gram keys of each text (1 for a short text)
    text_words: np.ndarray  # int32: normalized words of each text
    text_full: np.ndarray  # uint64: key of the text's whole word sequence (exact matches)
    item_bench: np.ndarray  # int16: index into ``benchmarks``
    item_ids: list[str]
    benchmarks: list[str]
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
    from pipeline.readers.paths import expand_path

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


def read_items(paths: Iterable[str], text_fields: Iterable[str] = DEFAULT_TEXT_FIELDS, id_field: str = "id",
               benchmark_field: str = "benchmark", bad: Counter | None = None) -> Iterator[Item]:
    """Every item of the benchmark files (JSONL, plain or compressed, or Parquet) in ``paths``.

    The item's texts are its ``text_fields`` that hold text (the first one found is its ``text``). The
    benchmark is the record's ``benchmark_field`` when it is a string, else the file's name; the id is the
    record's ``id_field`` (``name:line`` without one, as for any input). A record that cannot be read or has
    no text is counted in ``bad`` under the readers' reason (``bad_json``, ``missing_text``...).
    """
    text_fields = list(text_fields)
    from pipeline.readers.docs import is_blank, record_id
    from pipeline.readers.jsonl import iter_records
    from pipeline.readers.paths import detect_format

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
            texts = [t for t in (record.get(f) for f in text_fields) if isinstance(t, str) and not is_blank(t)]
            if not texts:
                if bad is not None:
                    bad["missing_text"] += 1
                continue
            bench = record.get(benchmark_field)
            yield Item(bench if isinstance(bench, str) and bench else fallback,
                       record_id(record, id_field, name, n), texts[0], tuple(texts[1:]))


def _parquet_records(path: str) -> Iterator[tuple[int, None, dict[str, Any]]]:
    import pyarrow.parquet as pq

    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            yield n, None, row
            n += 1


# ---- building ---------------------------------------------------------------------------------------------

def build_index(items: Iterable[Item], ngram: int = DEFAULT_NGRAM, min_words: int = DEFAULT_MIN_WORDS,
                stock_items: int = DEFAULT_STOCK_ITEMS) -> BenchmarkIndex:
    """Hash every item text's distinct grams (vectorized over the concatenated texts)."""
    if not 1 <= min_words <= ngram:
        raise ValueError(f"min_words must be in 1..ngram ({ngram}), got {min_words}")
    bench_no: dict[str, int] = {}
    item_bench: list[int] = []
    item_ids: list[str] = []
    text_item: list[int] = []
    parsed: list[list[str]] = []
    for item in items:
        for text in item.texts:
            text_item.append(len(item_ids))
            parsed.append(words(text))
        item_bench.append(bench_no.setdefault(item.benchmark, len(bench_no)))
        item_ids.append(item.id)
    benchmarks = list(bench_no)
    bench = np.array(item_bench, dtype=np.int16)
    owner_item = np.array(text_item, dtype=np.int64)
    n_words = np.array([len(ws) for ws in parsed], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(n_words)[:-1])).astype(np.int64) if parsed else n_words
    # word ids by Arrow's hash encoding (C speed; first-seen order, so the same items give the same ids)
    encoded = pa.array([w for ws in parsed for w in ws], type=pa.string()).dictionary_encode()
    ids = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    vocab = encoded.dictionary.to_pylist()
    prefix = Prefix(word_values(ids))
    has_letter = np.array([not w.isdigit() for w in vocab], dtype=np.int64)[ids]
    letters = np.concatenate(([0], np.cumsum(has_letter)))
    n_letter = letters[starts + n_words] - letters[starts]
    full = prefix.windows(starts, n_words)

    short = n_words < ngram
    too_short = short & (n_letter < min_words)
    candidates = short & ~too_short
    stock = candidates & (_items_holding(prefix, starts, n_words, full, candidates, owner_item) >= stock_items)
    kept = np.flatnonzero(~too_short & ~stock)
    keys, owner = _grams(prefix, starts[kept], n_words[kept], ngram, min_words)

    # distinct (key, text) pairs, then a CSR from each distinct key to its texts
    order = np.lexsort((owner, keys))
    keys, owner = keys[order], owner[order]
    new = np.ones(len(keys), dtype=bool)
    new[1:] = (keys[1:] != keys[:-1]) | (owner[1:] != owner[:-1])
    keys, owner = keys[new], owner[new]
    uniq, first = np.unique(keys, return_index=True)
    used = np.unique(ids[_positions(starts[kept], n_words[kept])])
    # an item none of whose texts is indexed: a stock question when one of them was one, else too short
    left_out = np.ones(len(item_ids), dtype=bool)
    left_out[owner_item[kept]] = False
    was_stock = np.zeros(len(item_ids), dtype=bool)
    was_stock[owner_item[stock]] = True
    return BenchmarkIndex(
        ngram=ngram, min_words=min_words, stock_items=stock_items,
        # words of left-out texts only are unknown to the matcher: their windows are never hashed
        vocab=_only(vocab, used),
        keys=uniq, offsets=np.append(first, len(keys)).astype(np.int64), owners=owner.astype(np.int32),
        text_item=owner_item[kept].astype(np.int32),
        text_grams=np.bincount(owner, minlength=len(kept)).astype(np.int32),
        text_words=n_words[kept].astype(np.int32), text_full=full[kept], item_bench=bench,
        item_ids=item_ids, benchmarks=benchmarks,
        skipped=_per_bench(bench[left_out & ~was_stock], benchmarks),
        stock=_per_bench(bench[left_out & was_stock], benchmarks),
    )


def _positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Every word position of the given items in the concatenation."""
    return np.repeat(starts, lengths) + np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _grams(prefix: Prefix, starts: np.ndarray, n_words: np.ndarray, ngram: int, head: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """``(key, item)`` of every ``ngram`` window inside each long item, and of each short item's head."""
    long = n_words >= ngram
    per_item = np.where(long, n_words - ngram + 1, 1)
    owner = np.repeat(np.arange(len(starts), dtype=np.int64), per_item)
    within = np.arange(len(owner)) - np.repeat(np.cumsum(per_item) - per_item, per_item)
    return prefix.windows(starts[owner] + within, np.where(long, ngram, head)[owner]), owner


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
                stock_items: int = DEFAULT_STOCK_ITEMS, text_fields: Iterable[str] = DEFAULT_TEXT_FIELDS,
                id_field: str = "id", benchmark_field: str = "benchmark", bad: Counter | None = None
                ) -> BenchmarkIndex:
    """:func:`build_index` over the items of the benchmark files in ``paths``."""
    return build_index(read_items(paths, text_fields, id_field, benchmark_field, bad), ngram, min_words, stock_items)
