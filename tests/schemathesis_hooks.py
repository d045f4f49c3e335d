"""Schemathesis hooks of tests/live_api.py's runs (``SCHEMATHESIS_HOOKS``; loaded by the schemathesis process).

- A valid (positive) spec's input and output point inside the service's roots, and a schedule's spec gets the
  dedup stage a schedule needs: random paths all stop at the 403 and random stages at the 422, so without this
  no job or schedule is ever created and the operations on one (through the schema's links) only see 404s.
  Invalid (negative) cases are left as generated: fixing their paths could make them valid.
- Every response's ``METHOD path-template status`` is appended to ``$TOKENMILL_FUZZ_STATUSES``, so the test can
  check that the run went deep (201s, streams of a job's events), not only that nothing failed.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import schemathesis

_INPUTS = os.environ.get("TOKENMILL_FUZZ_INPUTS", "")
_OUTPUT = os.environ.get("TOKENMILL_FUZZ_OUTPUT", "")
_STATUSES = os.environ.get("TOKENMILL_FUZZ_STATUSES", "")
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
    stages = spec.get("stages")
    if schedule and isinstance(stages, list) and not any(isinstance(s, dict) and "dedup" in str(s.get("type"))
                                                         for s in stages):
        stages.append({"type": "exact_dedup"})


@schemathesis.hook
def after_call(ctx: Any, case: Any, response: Any) -> None:
    if _STATUSES:
        with open(_STATUSES, "a") as f:
            f.write(f"{case.method.upper()} {case.path} {response.status_code}\n")
