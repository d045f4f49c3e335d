"""Request bodies in YAML: a spec pasted or sent as written (``Content-Type: application/yaml``).

The routes take JSON; :class:`service.api.edge.Edge`, which has read the whole body already, hands them a YAML
body as the equivalent JSON, so validation, errors and the OpenAPI schema stay one. PyYAML's safe loader
within the nesting limit (:mod:`pipeline.nesting`), with two refusals a request needs and a file on one's own
disk does not: aliases (``*name``: a few hundred bytes of nested aliases expand to gigabytes, the "billion
laughs"), and more than one document.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from pipeline import nesting

#: the media types read as YAML (RFC 9512's ``application/yaml`` and the older names still sent)
YAML_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"})


class _NoAliases(nesting.Loader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted in a request body", mark)
        return super().compose_node(parent, index)


def is_yaml(content_type: str | None) -> bool:
    return (content_type or "").split(";", 1)[0].strip().lower() in YAML_TYPES


def to_json(body: bytes) -> bytes | dict[str, Any]:
    """The body as JSON bytes, or the one problem (``{loc, msg, type}``, ``line L, column C: ...``) that stops it."""
    try:
        data = nesting.load_yaml(body.decode("utf-8"), _NoAliases)
    except nesting.TooDeep as exc:
        return _problem(f"line {exc.line}, column {exc.column}: {exc}", nesting.KIND)
    except UnicodeDecodeError as exc:
        return _problem(f"not UTF-8 ({exc.reason} at byte {exc.start})")
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return _problem(f"{where}{exc.problem or exc.context or 'not valid YAML'}")
    except yaml.YAMLError as exc:
        return _problem(f"not valid YAML: {str(exc).splitlines()[0]}")
    return json.dumps(data, default=str, ensure_ascii=False).encode()


def _problem(msg: str, kind: str = "yaml_invalid") -> dict[str, Any]:
    return {"loc": ["body"], "msg": msg, "type": kind}
