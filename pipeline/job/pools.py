"""How many Ray workers the curate graph asks for, and which stages share them: the rules alone, without Ray.

:mod:`pipeline.job.graph` builds the graph by these rules and ``tokenmill run --dry-run``
(:mod:`pipeline.job.plan_view`) shows what they give for a spec without starting Ray, so the plan it prints is the
graph a run builds.
"""

from __future__ import annotations

from collections.abc import Mapping


def reader_actors(par: int, files: int) -> int:
    """The readers' pool: one actor per file, at most ``par`` (the workers per stage)."""
    return min(par, max(1, files))


def fused_into_readers(chain: bool, resources: Mapping[str, float], files: int, par: int) -> bool:
    """Whether the batch stages right after the readers (``chain``, asking ``resources`` per worker) run inside
    the readers' workers: when there are files enough to keep every worker busy and they need one CPU only."""
    return chain and files >= 2 * par and set(resources) <= {"num_cpus"} and resources.get("num_cpus", 1) == 1
