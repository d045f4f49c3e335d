"""When a schedule fires: a cron expression read in an IANA time zone, and the clock the scheduler reads.

An expression is the classic five fields (minute hour day-of-month month day-of-week) or a macro
(``@hourly``, ``@daily``/``@midnight``, ``@weekly``, ``@monthly``, ``@yearly``/``@annually``). croniter
(a seconds field, ``@reboot``) offers more; they are refused here, so an expression means what crontab(5)
says. Fire times are computed by croniter on zone-aware datetimes (:mod:`zoneinfo`), and daylight-saving
changes follow Vixie cron (crontab(5), "DST"): a job whose time falls in the hour skipped in spring runs
at the first instant after the gap; in the hour repeated in autumn, a job with a fixed hour runs once (the
second pass is skipped), while one whose hour field is a wildcard (``*``, ``*/2``) runs on both passes, as
the clock really does go through them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import lru_cache
from zoneinfo import ZoneInfo, available_timezones

from croniter import CroniterBadDateError, CroniterError, croniter

from service.store.models import utcnow

#: the scheduler's notion of now (UTC, aware): injectable so tests fire schedules without waiting
Clock = Callable[[], datetime]
MACROS = frozenset({"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"})
#: next fire times an API answer lists
SHOWN_FIRE_TIMES = 5


def system_clock() -> datetime:
    return utcnow()


@lru_cache(maxsize=1)
def _zones() -> frozenset[str]:
    return frozenset(available_timezones())


def check_timezone(name: str) -> str:
    """``name`` if it is an IANA zone this machine knows (``Europe/Paris``, ``UTC``), else ValueError."""
    if name not in _zones():
        raise ValueError(f"{name!r} is not an IANA time zone name (e.g. 'UTC', 'Europe/Paris')")
    return name


def check_cron(expr: str) -> str:
    """The expression, whitespace-normalized, if it is five cron fields or a macro that fires; else ValueError
    (its message has no ``: ``, which the API would read as a field path)."""
    norm = " ".join(expr.split())
    if norm.startswith("@"):
        if norm.lower() not in MACROS:
            raise ValueError(f"{expr!r} is not a known macro ({', '.join(sorted(MACROS))})")
        norm = norm.lower()
    elif len(norm.split(" ")) != 5:
        raise ValueError(f"{expr!r} does not have the five fields minute hour day-of-month month day-of-week")
    if not croniter.is_valid(norm):
        raise ValueError(f"{expr!r} is not a valid cron expression")
    try:
        next_fire(norm, "UTC", datetime(2000, 1, 1, tzinfo=UTC))
    except CroniterError:
        raise ValueError(f"{expr!r} never fires (no such date)") from None
    return norm


def _fixed_hour(expr: str) -> bool:
    if expr.startswith("@"):
        return expr != "@hourly"
    return not expr.split(" ")[1].startswith("*")


def fire_times(expr: str, tz: str, after: datetime) -> Iterator[datetime]:
    """The slots strictly after ``after``, in UTC."""
    zone = ZoneInfo(tz)
    fixed = _fixed_hour(expr)
    it = croniter(expr, after.astimezone(zone))
    while True:
        try:
            t = it.get_next(datetime)
        except CroniterBadDateError:
            return
        local = t.astimezone(UTC).astimezone(zone)
        if fixed and local.fold == 1 and local.replace(fold=0).astimezone(UTC) != local.astimezone(UTC):
            continue  # the repeated hour's second pass (Vixie cron runs a fixed-hour job once)
        yield t.astimezone(UTC)


def next_fire(expr: str, tz: str, after: datetime) -> datetime:
    for t in fire_times(expr, tz, after):
        return t
    raise CroniterBadDateError(f"{expr!r} has no slot after {after.isoformat()}")


def upcoming(expr: str, tz: str, first: datetime | None, n: int = SHOWN_FIRE_TIMES) -> list[datetime]:
    """``first`` (the stored next slot) and the slots after it: what a schedule will do next."""
    if first is None:
        return []
    out = [first]
    for t in fire_times(expr, tz, first):
        if len(out) == n:
            break
        out.append(t)
    return out
