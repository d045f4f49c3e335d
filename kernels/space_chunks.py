"""A text cut before every space that starts a chunk: what the byte-level BPE fast path
(:mod:`pipeline.fast.byte_level_bpe`) looks up whole.

Why a kernel: most real texts hold a space before whitespace somewhere (indentation, a space before a line end),
so ``str.split(" ")`` cannot be used on them, and ``re.split`` plus the search that decided between the two were
most of what the encoder cost outside its dictionary lookups. The C extension ``kernels._text_native``
(``kernels/text_native.c``) does it in one pass.

**Must equal** :func:`space_chunks_py` (``re.split(r" (?=\\S)", text)``), which is also its **fallback**; it
**steps aside** where the extension is not built. **Difference test**: ``tests/test_fast_bpe.py``.
"""

from __future__ import annotations

import re
from types import ModuleType

_native: ModuleType | None  # the C extension (kernels/_text_native.pyi), None where it is not built
try:
    from kernels import _text_native as _native
except ImportError:  # not built (no compiler at install time): the Python path below
    _native = None

#: a space that does not start a chunk (followed by whitespace or at the end); its absence allows ``str.split``
_BAD_SPACE = re.compile(r" (?!\S)").search
#: cut before every space that starts a chunk (the space itself goes to the chunk it starts)
_CHUNK_SPLIT = re.compile(r" (?=\S)").split


def native() -> bool:
    """Whether the C extension is built (else :func:`space_chunks` runs in Python)."""
    return _native is not None


def space_chunks_py(text: str) -> list[str]:
    """``text`` cut at every space followed by a character that is not whitespace, the space dropped."""
    return text.split(" ") if _BAD_SPACE(text) is None else _CHUNK_SPLIT(text)


#: :func:`space_chunks_py`, in C where the extension is built
space_chunks = _native.space_chunks if _native is not None else space_chunks_py
