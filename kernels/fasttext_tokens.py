"""fastText's tokens of a batch of lines, numbered by distinct token: what the language-ID fast path needs to find
each token's cached row sum (:mod:`pipeline.fast.fasttext_predict`).

Why a kernel: on a long stream, most of the lid stage's cost was this step in Python (a str object per token,
``dict.fromkeys`` and a lookup per token). The C extension ``kernels._text_native`` (``kernels/text_native.c``,
built by ``pip install``; a C compiler and Python's headers are needed, and where they are missing the install
goes on without it) does it in one pass over the batch's UTF-8 bytes, with a batch-local hash table that compares
equal bytes exactly, and hands Python only the distinct tokens.

**Must equal** :func:`split_lines_py`, which is also its **fallback**; it **steps aside** where the extension is
not built. **Difference test**: ``tests/test_lid.py``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from kernels.text_chunks import number_distinct

_native: ModuleType | None  # the C extension (kernels/_text_native.pyi), None where it is not built
try:
    from kernels import _text_native as _native
except ImportError:  # not built (no compiler at install time): the Python path below
    _native = None

#: fastText's ``readWord`` separators (``src/dictionary.cc``); Python's ``str.split()`` splits on more
FT_SPACE = re.compile("[ \t\n\v\f\r\x00]+")
_FT_OTHER_SPACE = re.compile("[\t\n\v\f\r\x00]")
#: the batch-local table's hash seed, per process: inputs cannot be built to collide in it (equal hashes are
#: compared byte for byte anyway, so the seed changes speed, never a result)
_SEED = random.getrandbits(64)


def native() -> bool:
    """Whether the C extension is built (else :func:`split_lines` runs in Python)."""
    return _native is not None


def split_lines(lines: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The tokens of ``lines`` as fastText reads them (split on space, tab, vertical tab, form feed, carriage
    return, NUL and line feed): every distinct token once, in order of first occurrence; per token (all lines'
    tokens end to end), the index of its distinct token; per line, the number of tokens up to its end."""
    if _native is None or not lines:
        return split_lines_py(lines)
    joined = "\n".join(lines)
    if joined.count("\n") != len(lines) - 1:  # a line holding a line feed: one separator more, not a new line
        joined = "\n".join(line.replace("\n", " ") for line in lines)
    blob, ids, ends = _native.split(joined.encode("utf-8", "surrogatepass"), _SEED)
    distinct = blob.decode("utf-8", "surrogatepass").split("\n") if ids else []
    return distinct, np.frombuffer(ids, dtype=np.int64), np.frombuffer(ends, dtype=np.int64)


def split_lines_py(lines: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """:func:`split_lines` in Python (the same result)."""
    tokens: list[str] = []
    ends: list[int] = []
    for line in lines:
        parts = FT_SPACE.split(line) if _FT_OTHER_SPACE.search(line) else line.split(" ")
        tokens.extend(filter(None, parts))
        ends.append(len(tokens))
    distinct, ids = number_distinct(tokens)
    return distinct, ids, np.asarray(ends, dtype=np.int64)
