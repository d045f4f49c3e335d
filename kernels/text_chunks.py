"""The whitespace-separated chunks of a batch of texts (``str.split()``), numbered by distinct chunk, and word
lists put back together from each chunk's tokens: the word splitter's batch path
(:meth:`pipeline.filters.text.WordSplitter.words_many`).

Why a kernel: the splitter caches spaCy's tokens per chunk in a dict of ~a million entries, and in Python each
chunk of each document cost a str object and two probes of it (each waiting for memory), and the word
list a Python step per chunk. With ``kernels/text_native.c`` a batch's chunks are
numbered in a small table that stays in the CPU's cache, the large one is probed once per distinct chunk, and the
lists are built in C. :func:`split_texts_py` and :func:`assemble_py` are the same in Python.

**Must equal** :func:`split_texts_py` and :func:`assemble_py`, its Python twin, which is also its **fallback**; it
**steps aside** where the extension is not built. **Difference test**: ``tests/test_filters_heuristic.py``
(``test_words_many_in_c_equal_words_one_by_one``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from itertools import chain
from types import ModuleType

import numpy as np

_native: ModuleType | None  # the C extension (kernels/_text_native.pyi), None where it is not built
try:
    from kernels import _text_native as _native
except ImportError:  # not built (no compiler at install time): the Python path below
    _native = None

#: the batch-local table's hash seed, per process (equal hashes are compared character by character)
_SEED = random.getrandbits(64)


def native() -> bool:
    """Whether the C extension is built."""
    return _native is not None


def split_texts(texts: list[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``str.split()`` of every text: the distinct chunks in order of first occurrence; per chunk (all texts'
    chunks end to end), the index of its distinct chunk; per text, the number of chunks up to its end."""
    if _native is None:
        return split_texts_py(texts)
    distinct, ids, ends = _native.chunks(texts, _SEED)
    return distinct, np.frombuffer(ids, dtype=np.int64), np.frombuffer(ends, dtype=np.int64)


def assemble(parts: list[tuple[str, ...]], ids: np.ndarray, ends: np.ndarray) -> list[list[str]]:
    """Per text, the items of ``parts[i]`` for each of its chunk ids ``i``, in order."""
    if _native is None:
        return assemble_py(parts, ids, ends)
    return _native.assemble(parts, np.ascontiguousarray(ids, dtype=np.int64).tobytes(),
                            np.ascontiguousarray(ends, dtype=np.int64).tobytes())


def number_distinct(items: list[str]) -> tuple[list[str], np.ndarray]:
    """The distinct ``items`` in order of first occurrence, and per item the index of its distinct one: what the
    C kernels compute, in Python (a batch's own small dict, so every item is probed there, not in a large cache)."""
    local = dict.fromkeys(items)
    distinct = list(local)
    local.update(zip(distinct, range(len(distinct)), strict=True))
    return distinct, np.fromiter(map(local.__getitem__, items), dtype=np.int64, count=len(items))


def split_texts_py(texts: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """:func:`split_texts` in Python (the same result)."""
    chunks: list[str] = []
    ends: list[int] = []
    for text in texts:
        chunks.extend(text.split())
        ends.append(len(chunks))
    distinct, ids = number_distinct(chunks)
    return distinct, ids, np.asarray(ends, dtype=np.int64)


def assemble_py(parts: Sequence[tuple[str, ...]], ids: np.ndarray, ends: np.ndarray) -> list[list[str]]:
    """:func:`assemble` in Python (the same result)."""
    out = []
    starts = [0, *ends.tolist()[:-1]]
    idl = ids.tolist()
    for a, b in zip(starts, ends.tolist(), strict=True):
        out.append(list(chain.from_iterable(parts[i] for i in idl[a:b])))
    return out
