"""The options that say where the service keeps its state (``--state-dir``, ``--database-url``,
``--database-schema``) and the settings they make: shared by ``tokenmill serve`` and ``tokenmill apikey``."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from pipeline.problems import SpecError, problems_of


def add_database_options(p: argparse.ArgumentParser, after: bool = False) -> None:
    """The database options; ``after``: on an action's parser, where an option not given leaves the value the
    main parser read (argparse's ``SUPPRESS`` default sets nothing), so it may come before or after the action."""
    default: Any = argparse.SUPPRESS if after else None
    p.add_argument("--database-url", default=default,
                   help="SQLAlchemy URL ($TOKENMILL_DATABASE_URL; default a SQLite file)")
    p.add_argument("--database-schema", default=default,
                   help="PostgreSQL schema for the tables ($TOKENMILL_DATABASE_SCHEMA)")


def add_store_options(p: argparse.ArgumentParser, after: bool = False) -> None:
    """``--state-dir`` and the database options (see :func:`add_database_options` for ``after``)."""
    p.add_argument("--state-dir", default=argparse.SUPPRESS if after else None,
                   help="the service's state folder, whose SQLite file holds the keys ($TOKENMILL_STATE_DIR)")
    add_database_options(p, after)


def settings_of(args: argparse.Namespace, **overrides: Any) -> Any:
    """The service's settings; :class:`~pipeline.problems.SpecError` (one ``field: message`` line each) if invalid."""
    from service.settings import Settings  # lazy: pulls pipeline.spec (pyarrow, yaml; 0.3 s), not for -h

    try:
        return Settings.from_env(state_dir=args.state_dir, database_url=args.database_url,
                                 database_schema=args.database_schema, **overrides)
    except ValidationError as exc:
        raise SpecError(problems_of(exc)) from None
