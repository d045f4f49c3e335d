"""Benchmark files as evaluation items: MMLU, TruthfulQA, GSM8K and HumanEval JSONL (plain, ``.gz`` or ``.zst``).

An item is named as the decontaminate stage names it (``pipeline.decontam.index.read_items``), so the items a
job found match the items scored here: the benchmark is the record's ``benchmark`` field, else the file's name
less its format and compression; the id is the record's ``id`` (a string, or an int as text), else
``FILE:LINE`` with the 0-based line number (blank lines count). That reader is not used itself: it keeps only
the texts (MMLU's choices become one text, its answer letter is dropped as a label), and the trainer may import
nothing of the pipeline beyond the shard contract (tests/test_import_graph.py).

Prompts (zero-shot, the cloze form that small models are compared with, as FineWeb's and OLMES' ablations do):
a question is ``Question: {question}\\nAnswer:`` and each choice or reference answer its continuation after a
space; HumanEval's prompt is its code and the canonical solution continues it as is.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import zstandard

#: the question and how its choices or reference answer follow it
QUESTION = "Question: {question}\nAnswer:"


class BenchError(ValueError):
    """A benchmark file that cannot be read as its task needs; the message names the file, line and field."""


@dataclass(frozen=True)
class Record:
    """One JSON object of a benchmark file, with the item's name as the decontaminate stage records it."""

    benchmark: str
    id: str
    where: str  # FILE:LINE, for messages
    data: dict[str, Any]

    def text(self, name: str) -> str:
        value = self.data.get(name)
        if not isinstance(value, str) or not value.strip():
            raise BenchError(f"{self.where}: field {name!r}: a non-empty string is needed, got {_shown(value)}")
        return value


@dataclass(frozen=True)
class ChoiceItem:
    """A multiple-choice item: the prompt, the continuations to compare and the index of the right one."""

    record: Record
    context: str
    choices: tuple[str, ...]
    answer: int


@dataclass(frozen=True)
class AnswerItem:
    """An item scored by the bits per byte of its reference answer given its prompt."""

    record: Record
    context: str
    answer: str


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def benchmark_name(path: str) -> str:
    """``gsm8k_test`` for ``.../gsm8k_test.jsonl.gz`` (the decontaminate stage's name for a file's items)."""
    name = os.path.basename(path)
    for suffix in (".gz", ".zst", ".zstd"):
        name = name.removesuffix(suffix)
    for suffix in (".jsonl", ".ndjson", ".json"):
        name = name.removesuffix(suffix)
    return name


def record_id(record: dict[str, Any], name: str, line: int) -> str:
    """The record's ``id`` when it is a string (UTF-8 encodable) or an int, else ``name:line``."""
    value = record.get("id")
    if isinstance(value, str) and value:
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            pass
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f"{name}:{line}"


def open_lines(path: str) -> IO[bytes]:
    """The decompressed bytes of a local JSONL file (by its suffix: ``.gz``, ``.zst``/``.zstd`` or plain)."""
    if path.endswith(".gz"):
        return io.BufferedReader(gzip.GzipFile(path, "rb"))
    if path.endswith((".zst", ".zstd")):
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


def read_records(path: str, limit: int | None = None) -> Iterator[Record]:
    """The JSON objects of a JSONL file, in order, the first ``limit`` only when given."""
    if not os.path.isfile(path):
        raise BenchError(f"{path}: no such file")
    name = os.path.basename(path)
    fallback = benchmark_name(path)
    count = 0
    try:
        with open_lines(path) as fh:
            for line_no, line in enumerate(fh):
                if limit is not None and count >= limit:
                    return
                if not line.strip():
                    continue
                where = f"{name}:{line_no + 1}"
                try:
                    data = json.loads(line)
                except ValueError as exc:
                    raise BenchError(f"{where}: not JSON: {exc}") from None
                if not isinstance(data, dict):
                    raise BenchError(f"{where}: a JSON object is needed, got {type(data).__name__}")
                bench = data.get("benchmark")
                yield Record(bench if isinstance(bench, str) and bench else fallback, record_id(data, name, line_no),
                             where, data)
                count += 1
    except (OSError, EOFError, zstandard.ZstdError) as exc:
        raise BenchError(f"{path}: cannot read: {exc}") from None


def _answer_index(record: Record, n_choices: int) -> int:
    """MMLU's answer: a letter (``B``) or a 0-based index."""
    value = record.data.get("answer")
    if isinstance(value, str) and len(value.strip()) == 1 and value.strip().isalpha():
        index = ord(value.strip().upper()) - ord("A")
    elif isinstance(value, int) and not isinstance(value, bool):
        index = value
    else:
        raise BenchError(f"{record.where}: field 'answer': a letter or a choice index is needed, got {_shown(value)}")
    if not 0 <= index < n_choices:
        raise BenchError(f"{record.where}: field 'answer': {_shown(value)} is not one of the {n_choices} choices")
    return index


def _strings(record: Record, name: str, split: str | None = None) -> list[str]:
    value = record.data.get(name)
    if isinstance(value, str) and split is not None:
        value = [part.strip() for part in value.split(split) if part.strip()]  # "a; b;" has two
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise BenchError(f"{record.where}: field {name!r}: a list of non-empty strings is needed, got {_shown(value)}")
    return value


def mmlu_item(record: Record) -> ChoiceItem:
    """``question``, ``choices`` (a list) and ``answer`` (a letter or an index)."""
    choices = _strings(record, "choices")
    return ChoiceItem(record, QUESTION.format(question=record.text("question")),
                      tuple(" " + c for c in choices), _answer_index(record, len(choices)))


def truthfulqa_item(record: Record) -> ChoiceItem:
    """``best_answer`` against each of ``incorrect_answers`` (a list, or one string of answers joined by
    ``; `` as the shared file has them): the right choice is the best answer (TruthfulQA's MC1)."""
    wrong = _strings(record, "incorrect_answers", split=";")
    choices = [record.text("best_answer"), *wrong]
    return ChoiceItem(record, QUESTION.format(question=record.text("question")), tuple(" " + c for c in choices), 0)


def gsm8k_item(record: Record) -> AnswerItem:
    """``question`` and the reference solution ``answer`` (its reasoning and ``#### result``)."""
    return AnswerItem(record, QUESTION.format(question=record.text("question")), " " + record.text("answer"))


def humaneval_item(record: Record) -> AnswerItem:
    """``prompt`` (signature and docstring) continued by ``canonical_solution`` (the function's body)."""
    return AnswerItem(record, record.text("prompt"), record.text("canonical_solution"))


#: the benchmark formats: task kind -> how a record becomes an item
CHOICE_FORMATS: dict[str, Callable[[Record], ChoiceItem]] = {"mmlu": mmlu_item, "truthfulqa": truthfulqa_item}
ANSWER_FORMATS: dict[str, Callable[[Record], AnswerItem]] = {"gsm8k": gsm8k_item, "humaneval": humaneval_item}
