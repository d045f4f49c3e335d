"""Schemathesis hooks of tests/live_api.py's runs (``SCHEMATHESIS_HOOKS``; loaded by the schemathesis process).

- A valid (positive) spec's input and output point inside the service's roots: random paths all stop at the
  403, so without this no job or schedule is ever created and the operations on one (through the schema's
  links) only see 404s. Nothing else of a body is changed (a schedule's dedup stage is the schema's to ask for).
  Invalid (negative) cases are left as generated: fixing their paths could make them valid.
- Every response's ``METHOD path-template status`` is appended to ``$TOKENMILL_FUZZ_STATUSES``, so the test can
  check that the run went deep (201s, streams of a job's events), not only that nothing failed; and each
  problem of a 422 to a valid body, as ``[METHOD, path-template, loc, type]``, to ``$TOKENMILL_FUZZ_REFUSED``, so
  the test can check that each is one of the few rules no JSON schema states (tests/live_api.py).
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import schemathesis

_INPUTS = os.environ.get("TOKENMILL_FUZZ_INPUTS", "")
_OUTPUT = os.environ.get("TOKENMILL_FUZZ_OUTPUT", "")
_STATUSES = os.environ.get("TOKENMILL_FUZZ_STATUSES", "")
_REFUSED = os.environ.get("TOKENMILL_FUZZ_REFUSED", "")
_count = itertools.count()


@schemathesis.hook
def before_call(ctx: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if case.meta is None or not case.meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return
    schedule = case.path.startswith("/v1/schedules")
    spec = case.body.get("spec") if schedule else case.body
    if not isinstance(spec, dict):
        return
    for inp in spec.get("inputs") or []:
        if isinstance(inp, dict) and "path" in inp:
            inp["path"] = _INPUTS
    if isinstance(spec.get("output"), dict) and "path" in spec["output"]:
        spec["output"]["path"] = os.path.join(_OUTPUT, f"fuzz-{next(_count)}")


@schemathesis.hook
def after_call(ctx: Any, case: Any, response: Any) -> None:
    if _STATUSES:
        with open(_STATUSES, "a") as f:
            f.write(f"{case.method.upper()} {case.path} {response.status_code}\n")
    if _REFUSED and response.status_code == 422 and case.meta is not None and case.meta.generation.mode.is_positive:
        with open(_REFUSED, "a") as f:
            for problem in response.json()["detail"]:
                f.write(json.dumps([case.method.upper(), case.path, problem["loc"], problem["type"]]) + "\n")
