"""``tokenmill apikey create|list|revoke``: API keys, in the service's database (a key is shown once, at
creation). Exit 2 for an unknown key or team, 1 for a database that cannot be reached."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pipeline.error_line import error_line
from service.commands.exits import EXIT_FAILURE, EXIT_OK, error
from service.commands.store_options import add_store_options, settings_of
from service.roles import DEFAULT_ROLE, Role


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill apikey", description="Create, list and revoke API keys "
                                "(in the service's database; a key is shown once, at creation). The database "
                                "options go before or after the action.")
    add_store_options(p)
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION",
                           help="create (prints the new key), list, or revoke a key")
    c = sub.add_parser("create", help="make a key and print it (shown only now)")
    c.add_argument("--name", required=True, help="who or what uses it")
    c.add_argument("--role", choices=[str(r) for r in Role], default=str(DEFAULT_ROLE),
                   help="admin: everything, every team; member (default): submit and act on its team's jobs, "
                        "schedules and mixtures; reader: read its team's (a training cluster's loader)")
    c.add_argument("--team", default="default", help="the team whose work the key sees and acts on (default: "
                                                     "default, the team keys made before teams belong to)")
    lst = sub.add_parser("list", help="every key: id, state, last use, role, team, name")
    r = sub.add_parser("revoke", help="stop a key working (a server notices within $TOKENMILL_AUTH_CACHE_S)")
    r.add_argument("key_id", help="the key's id, as `tokenmill apikey list` shows it")
    for action in (c, lst, r):  # after the action too: `apikey create --state-dir svc --name me`
        add_store_options(action, after=True)
    return p


def run(args: argparse.Namespace) -> int:
    # lazy: sqlalchemy and the store's models (0.3 s), only for apikey
    from service.roles import check_team
    from service.store import repo
    from service.store.db import Database

    if args.action == "create":
        try:
            check_team(args.team)
        except ValueError as exc:
            return error(f"--team: {exc}")
    try:
        settings = settings_of(args)
        db = Database(settings.db_url, schema=settings.database_schema)
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        db.migrate()
        with db.session() as s:
            _ACTIONS[args.action](s, args)
        db.dispose()
    except repo.NotFound as exc:
        return error(exc)
    except Exception as exc:  # noqa: BLE001 - a database that cannot be reached: one line
        return error(error_line(exc), EXIT_FAILURE)
    return EXIT_OK


def _create(s: Any, args: argparse.Namespace) -> None:
    from service.store import repo  # lazy: see run

    key, token = repo.create_key(s, args.name, role=args.role, team=args.team)
    print(token)
    print(f"key {key.id} ({args.name}, {key.role} of team {key.team}) created; it is shown only now: store it",
          file=sys.stderr)


def _list(s: Any, args: argparse.Namespace) -> None:
    from service.store import repo  # lazy: see run

    for key in repo.list_keys(s):
        state = f"revoked {key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "active"
        used = f"{key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "never"
        print(f"{key.id}  {state:<24} used {used:<16}  {key.role:<6}  {key.team:<16}  {key.name}")


def _revoke(s: Any, args: argparse.Namespace) -> None:
    from service.store import repo  # lazy: see run

    key = repo.revoke_key(s, args.key_id)
    print(f"key {key.id} ({key.name}) revoked")


_ACTIONS = {"create": _create, "list": _list, "revoke": _revoke}


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

