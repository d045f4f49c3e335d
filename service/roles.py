"""The words of the trust model: the three roles and what a team's name may be (the policy that uses them is
:mod:`service.api.access`). Kept apart, without FastAPI, for the command line and the settings."""

from __future__ import annotations

import re
from enum import StrEnum


class Role(StrEnum):
    ADMIN = "admin"
    MEMBER = "member"
    READER = "reader"


#: what ``tokenmill apikey create`` gives without ``--role``
DEFAULT_ROLE = Role.MEMBER
#: a team's name: what ``--team`` and ``--root TEAM=PATH`` take
TEAM_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
TEAM_RULE = "a team is 1 to 64 of a-z, 0-9, '_', '-', starting with a letter or digit"


def check_team(team: str) -> str:
    """``team`` if it is a valid team name, else ValueError saying the rule."""
    if not TEAM_RE.fullmatch(team):
        raise ValueError(f"team {team!r}: {TEAM_RULE}")
    return team
