"""The nesting limit of a spec, checked before a parser that recurses sees the text.

``json.loads`` and PyYAML's composer recurse once per level (or more): 1,000 nested ``[`` in 2 KB of a request
body or a spec file exhausted Python's stack (a ``RecursionError``: a 500 and 3,000 lines of log). A real spec
nests under 10 levels; :data:`MAX_DEPTH` leaves room for stage parameters and refuses the rest, for every
caller (the API's JSON and YAML bodies, ``tokenmill run``, ``submit`` and ``mix``'s files):

- JSON: :func:`check_json`, a linear scan of the brackets outside strings, before ``json.loads``;
- YAML: :class:`Loader`, PyYAML's safe loader whose composer counts the levels it enters (an alias counts the
  levels of the node it names) and stops at the limit, before its recursion goes deeper. The scanner and
  parser under it are state machines and the constructor is iterative: nothing else recurses.

Both raise :class:`TooDeep` (a ``ValueError``), whose message names the limit.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import yaml

#: the deepest nesting of lists and mappings a spec or a request body may have (a real spec: under 10)
MAX_DEPTH = 64
#: ``type`` of the API's problem for a body nested deeper
KIND = "too_deep"

#: a JSON string (an unterminated one runs to the end): possessive, so each byte is looked at once
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"?', re.S)
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as int8


class TooDeep(ValueError):
    """Nested deeper than :data:`MAX_DEPTH`; ``line`` and ``column`` (1-based) where YAML went past it."""

    def __init__(self, line: int | None = None, column: int | None = None):
        self.line, self.column = line, column
        super().__init__(f"nested deeper than {MAX_DEPTH} levels of lists and mappings (the limit for a spec)")

    def at(self, path: Any) -> str:
        """The message after the file's name and, from YAML, ``:LINE:COL`` (a spec file's syntax error's form)."""
        return f"{path}{f':{self.line}:{self.column}' if self.line else ''}: {self}"


def check_json(text: str | bytes) -> None:
    """:class:`TooDeep` if the JSON ``text`` nests deeper than :data:`MAX_DEPTH`; linear, never recursive.
    Whatever else is wrong with it is ``json.loads``'s to say."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:  # cannot be too deep: every spec body, at no cost
        return
    steps = _STRING.sub(b"", raw).translate(_STEP, _NOT_BRACKETS)
    if steps and int(np.cumsum(np.frombuffer(steps, dtype=np.int8), dtype=np.int64).max()) > MAX_DEPTH:
        raise TooDeep()


class Loader(yaml.SafeLoader):
    """PyYAML's safe loader, its composer stopped at :data:`MAX_DEPTH` levels (:class:`TooDeep`)."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._depth = 0
        self._heights: dict[int, int] = {}  # id(node) -> the levels at and below it (a collection's, once composed)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):  # the node it names nests below this level too
            named = self.anchors.get(event.anchor)
            height = self._heights.get(id(named), 0 if named is None or isinstance(named, yaml.ScalarNode)
                                       else MAX_DEPTH + 1)  # a collection still open: it holds itself
            self._past(self._depth + height, event)
            return super().compose_node(parent, index)
        if not isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        self._past(self._depth + 1, event)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        assert node is not None  # a collection's start event: a collection node
        children = node.value if isinstance(node, yaml.SequenceNode) else [v for kv in node.value for v in kv]
        self._heights[id(node)] = 1 + max((self._heights.get(id(c), 0) for c in children), default=0)
        return node

    def _past(self, depth: int, event: yaml.Event) -> None:
        if depth > MAX_DEPTH:
            mark = event.start_mark
            raise TooDeep(*((mark.line + 1, mark.column + 1) if mark is not None else ()))


def load_yaml(text: str, loader: type[Loader] = Loader) -> Any:
    """``yaml.safe_load(text)`` within :data:`MAX_DEPTH` (:class:`TooDeep`); ``loader``: a subclass with more
    refusals (a request body's)."""
    return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
