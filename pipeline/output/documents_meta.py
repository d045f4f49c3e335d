"""``meta`` in the Parquet ``documents`` output: an Arrow struct every dataset reader can address, or JSON text.

Inside the pipeline ``meta`` is a JSON string (:data:`pipeline.documents.DOC_SCHEMA`); in the output it is a
struct so that ``meta.lang`` works in DuckDB, pandas, polars and HF datasets. Every part must have the same
schema (multi-file readers refuse parts that differ), so each export range is first profiled
(:func:`profile_meta`: its inferred type and where dict values are null, absent or ``{}``), the driver unifies
the profiles into one :class:`MetaPlan`, and every part is written with that type.

A struct has one null for "key absent" and "value null": where the profiles show that a key is never
absent, its nulls decode as ``None`` (``nulls``, in each part's schema metadata under :data:`META_KEY`),
elsewhere as "absent", and :func:`decode_meta` gives back the exact dict. A dict that is only ever ``{}``
(a struct with no field cannot be written to Parquet) is a struct of one null field :data:`EMPTY_FIELD`
(``empties``), decoded back to ``{}``. The whole column falls back to JSON text (``"meta": "json"`` in
``documents.json``, with the reason) when the values cannot share one type (a field that is a string in one
document and an int in another, a list mixing strings and floats, an int over 64 bits), when a key is
null in some documents and absent in others, when the struct would have more than :data:`MAX_FIELDS`
fields, or when every meta is empty (each is then ``"{}"``). Each part is
decoded back and compared before it is kept (:func:`encode_meta`), so a value is never lost: a mismatch
sends the whole column to JSON. Ints in a field that also holds fractions become floats (equal values).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

#: the ``documents/`` listing, beside the folder (``OUT/documents.json``), not in it: ``documents/`` then holds
#: only its parts, a dataset folder every reader takes whole (HF ``data_dir=`` and polars read every file of it)
DOCUMENTS_INDEX_NAME = "documents.json"
#: where outputs written before kept it, inside the folder (``documents/index.json``; still read, and skipped
#: by ``format: documents``)
LEGACY_INDEX_NAME = "index.json"
#: Parquet schema metadata key of every struct-meta part: how its nulls decode (:class:`MetaRules`)
META_KEY = b"tokenmill.meta"
#: more struct fields than this (keys that vary per document without bound) and meta stays JSON text
MAX_FIELDS = 1000

#: the one field of a dict that is only ever ``{}`` (a placeholder: such a dict has no key of its own)
EMPTY_FIELD = "_empty"
#: a position in meta: dict keys, ``None`` for "an element of a list"
MetaPath = tuple[str | None, ...]


def parse_meta_json(text: str | None) -> Any:
    """A curated ``meta`` string as a value (``{}`` for empty); json's parser where orjson refuses (NaN)."""
    if not text:
        return {}
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


@dataclass
class MetaProfile:
    """One export range's meta: its inferred Arrow type (None, with ``problem``, when none fits) and counts
    of ``("dict", path)`` dicts, ``("key", path)`` keys present and ``("null", path)`` null values."""

    type: pa.DataType | None
    counts: Counter = field(default_factory=Counter)
    problem: str = ""


def profile_meta(metas: list[Any]) -> MetaProfile:
    counts: Counter = Counter()
    for m in metas:
        if not isinstance(m, dict):
            return MetaProfile(None, counts, "a meta that is not an object")
        _count(m, (), counts)
    try:
        return MetaProfile(pa.array(metas).type, counts)
    except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
        return MetaProfile(None, counts, f"no one type fits: {str(exc).splitlines()[0][:200]}")


def _count(value: Any, path: MetaPath, counts: Counter) -> None:
    if isinstance(value, dict):
        counts["dict", path] += 1
        for k, v in value.items():
            counts["key", path + (k,)] += 1
            if v is None:
                counts["null", path + (k,)] += 1
            _count(v, path + (k,), counts)
    elif isinstance(value, list):
        for v in value:
            _count(v, path + (None,), counts)


@dataclass(frozen=True)
class MetaRules:
    """How a struct decodes: a null is ``None`` at ``nulls`` (else "key absent"); a struct at ``empties`` is ``{}``."""

    nulls: frozenset[MetaPath] = frozenset()
    empties: frozenset[MetaPath] = frozenset()

    def metadata(self) -> dict[bytes, bytes]:
        def paths(s: frozenset[MetaPath]) -> list[list[str | None]]:
            return sorted((list(p) for p in s), key=lambda p: json.dumps(p))
        return {META_KEY: json.dumps({"meta": "struct", "nulls": paths(self.nulls),
                                      "empties": paths(self.empties)}).encode()}

    @classmethod
    def from_metadata(cls, metadata: dict[bytes, bytes] | None) -> MetaRules:
        """The rules a part was written with; none (every null is "absent") for a part without them."""
        try:
            data = json.loads((metadata or {}).get(META_KEY) or b"{}")
            return cls(*(frozenset(tuple(p) for p in data.get(k, []) if isinstance(p, list)
                                   and all(s is None or isinstance(s, str) for s in p)) for k in ("nulls", "empties")))
        except (ValueError, TypeError, AttributeError):  # someone else's metadata: every null reads as absent
            return cls()


@dataclass(frozen=True)
class MetaPlan:
    """How every part stores meta: ``struct`` of ``type`` decoded by ``rules``, or ``json`` text (``reason``)."""

    mode: str
    type: pa.DataType | None = None
    rules: MetaRules = MetaRules()
    reason: str = ""

    def to_json(self) -> dict[str, str]:
        """Its line in ``documents.json``."""
        return {"meta": self.mode, **({"meta_fallback": self.reason} if self.reason else {})}


def json_plan(reason: str) -> MetaPlan:
    return MetaPlan("json", reason=reason)


def unify_meta(profiles: list[MetaProfile]) -> MetaPlan:
    """One plan for every part, the same for any parallelism (profiles come in range order)."""
    bad = next((p.problem for p in profiles if p.type is None), None)
    if bad is not None:
        return json_plan(bad)
    if not profiles:
        return json_plan("no documents")
    try:
        merged = pa.unify_schemas([pa.schema([("meta", p.type)]) for p in profiles], promote_options="permissive")
    except (pa.ArrowException, TypeError, ValueError) as exc:
        return json_plan(f"no one type fits: {str(exc).splitlines()[0][:200]}")
    counts: Counter = sum((p.counts for p in profiles), Counter())
    t = merged.field("meta").type
    if not pa.types.is_struct(t) or t.num_fields == 0:
        return json_plan("every meta is empty")
    nulls: set[MetaPath] = set()
    empties: set[MetaPath] = set()
    try:
        t = _plan_type(t, (), counts, nulls, empties)
    except _Conflict as exc:
        return json_plan(str(exc))
    if _fields(t) > MAX_FIELDS:
        return json_plan(f"more than {MAX_FIELDS} struct fields")
    return MetaPlan("struct", t, MetaRules(frozenset(nulls), frozenset(empties)))


class _Conflict(Exception):
    pass


def _plan_type(t: pa.DataType, path: MetaPath, counts: Counter, nulls: set[MetaPath],
               empties: set[MetaPath]) -> pa.DataType:
    """``t`` with fields sorted as dump_meta sorts keys and ``struct<>`` given its placeholder field;
    ``nulls``/``empties`` filled."""
    if pa.types.is_struct(t) and t.num_fields == 0:
        empties.add(path)
        return pa.struct([pa.field(EMPTY_FIELD, pa.null())])
    if pa.types.is_struct(t):
        children = []
        for f in sorted((t.field(i) for i in range(t.num_fields)), key=lambda f: f.name):
            p = path + (f.name,)
            absent = counts["dict", path] - counts["key", p]
            if counts["null", p] and absent:
                where = ".".join("[]" if k is None else k for k in p)
                raise _Conflict(f"meta.{where} is null in some documents and absent in others")
            if counts["null", p]:
                nulls.add(p)
            children.append(pa.field(f.name, _plan_type(f.type, p, counts, nulls, empties)))
        return pa.struct(children)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = _plan_type(t.value_type, path + (None,), counts, nulls, empties)
        return pa.large_list(item) if pa.types.is_large_list(t) else pa.list_(item)
    return t


def _fields(t: pa.DataType) -> int:
    if pa.types.is_struct(t):
        return sum(1 + _fields(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _fields(t.value_type)
    return 0


def encode_meta(metas: list[Any], plan: MetaPlan) -> pa.Array | None:
    """The range's metas as ``plan.type``; None when they do not decode back to the same values (the
    caller then stores the whole column as JSON)."""
    assert plan.type is not None
    try:
        array = pa.array(metas, type=plan.type)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return None
    back = [decode_meta(m, plan.rules) for m in array.to_pylist()]
    return array if back == metas else None


def decode_meta(value: Any, rules: MetaRules) -> dict[str, Any]:
    """A struct meta row (``to_pylist``) as the dict it was written from."""
    out = _decode(value, (), rules) if value is not None else {}
    return out if isinstance(out, dict) else {}


def _decode(value: Any, path: MetaPath, rules: MetaRules) -> Any:
    if isinstance(value, dict) and path in rules.empties:
        return {}
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            p = path + (k,)
            if v is not None:
                out[k] = _decode(v, p, rules)
            elif p in rules.nulls:
                out[k] = None
        return out
    if isinstance(value, list):
        return [_decode(v, path + (None,), rules) for v in value]
    return value


def meta_value(value: Any, rules: MetaRules) -> Any:
    """A documents row's ``meta`` as a value: a struct decoded by ``rules``, JSON text parsed (old outputs,
    the JSON fallback); ``{}`` for none. Raises ValueError for JSON text that does not parse."""
    if isinstance(value, str):
        return parse_meta_json(value)
    if isinstance(value, dict):
        return decode_meta(value, rules)
    return {} if value is None else value
