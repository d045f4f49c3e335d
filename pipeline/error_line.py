"""An exception as one short line, ``TypeName: first line of its message``: what a log record, an event, a
readiness check or a rejected record's detail shows of a failure whose message may run to many lines (a
database driver's, a decompressor's, a traceback-like text)."""

from __future__ import annotations


def error_line(exc: BaseException) -> str:
    """``ValueError: bad thing`` (``ValueError: `` for an empty message)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
