"""The service's settings: from ``tokenmill serve`` flags, else ``TOKENMILL_*`` environment variables, else defaults.

========================  =============================  ====================================================
setting                   environment variable           default
========================  =============================  ====================================================
state_dir                 TOKENMILL_STATE_DIR            ``./tokenmill-service`` (jobs' logs and events, the lock)
database_url              TOKENMILL_DATABASE_URL         ``sqlite:///STATE_DIR/tokenmill.db``
database_schema           TOKENMILL_DATABASE_SCHEMA      none (PostgreSQL only: the tables' schema)
input_roots               TOKENMILL_INPUT_ROOTS          ``STATE_DIR/data`` (``:``-separated folders)
output_roots              TOKENMILL_OUTPUT_ROOTS         ``STATE_DIR/data``
(both)                    TOKENMILL_ROOTS                sets both lists at once
max_running               TOKENMILL_MAX_RUNNING          1 (see ``service.runner.supervisor.RunnerConfig``)
ray_address               TOKENMILL_RAY_ADDRESS          none: each job starts a local Ray
job_cpus                  TOKENMILL_JOB_CPUS             none: a local Ray takes every CPU
max_body_bytes            TOKENMILL_MAX_BODY_BYTES       1 MiB
========================  =============================  ====================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.confine import Roots

#: a request body larger than this gets 413. A job spec is a few kilobytes (the largest in tests/ is under
#: 2 KB); a megabyte leaves room for long stage lists while keeping a flood of bodies cheap to refuse
MAX_BODY_BYTES = 1 << 20


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: Path = Path("tokenmill-service")
    database_url: str | None = None
    database_schema: str | None = None
    input_roots: tuple[Path, ...] = ()
    output_roots: tuple[Path, ...] = ()
    max_running: int = Field(1, ge=1)
    ray_address: str | None = None
    job_cpus: int | None = Field(None, ge=1)
    max_body_bytes: int = Field(MAX_BODY_BYTES, ge=1024)
    #: run the supervisor in this process (off: an API-only process, as in tests of the API alone)
    run_supervisor: bool = True
    #: serve /docs, /redoc and /openapi.json without a key (off: only /openapi.json, with a key)
    public_docs: bool = False
    #: see :class:`service.runner.supervisor.RunnerConfig`
    max_lost: int = Field(3, ge=1)
    cancel_grace_s: float = Field(60.0, gt=0)
    poll_s: float = Field(0.5, gt=0)
    #: seconds between two database reads of a server-sent event stream that has nothing new
    events_poll_s: float = Field(0.5, gt=0)

    @field_validator("state_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        """Absolute, so the attempts' folders recorded in the database mean the same after a restart from
        another working directory."""
        return Path(os.path.abspath(value))

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.state_dir / 'tokenmill.db'}"

    def roots(self) -> Roots:
        default = (self.state_dir / "data",)
        return Roots.of(self.input_roots or default, self.output_roots or default)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``TOKENMILL_*`` variables; ``overrides`` (not None) win."""
        env = os.environ if environ is None else environ

        def paths(name: str) -> tuple[Path, ...] | None:
            raw = env.get(name) or env.get("TOKENMILL_ROOTS")
            return tuple(Path(p) for p in raw.split(os.pathsep) if p) if raw else None

        values: dict[str, Any] = {
            "state_dir": env.get("TOKENMILL_STATE_DIR"),
            "database_url": env.get("TOKENMILL_DATABASE_URL"),
            "database_schema": env.get("TOKENMILL_DATABASE_SCHEMA"),
            "input_roots": paths("TOKENMILL_INPUT_ROOTS"),
            "output_roots": paths("TOKENMILL_OUTPUT_ROOTS"),
            "max_running": env.get("TOKENMILL_MAX_RUNNING"),
            "ray_address": env.get("TOKENMILL_RAY_ADDRESS"),
            "job_cpus": env.get("TOKENMILL_JOB_CPUS"),
            "max_body_bytes": env.get("TOKENMILL_MAX_BODY_BYTES"),
        }
        values.update(overrides)
        return cls(**{k: v for k, v in values.items() if v not in (None, "")})
