"""Budget periods: UTC days and UTC calendar months."""

from __future__ import annotations

import datetime as dt
import math


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def period_start(period: str, at: dt.datetime | None = None) -> dt.date:
    """First UTC day of the period (``"day"`` or ``"month"``) holding ``at`` (default now)."""
    day = (at or now()).astimezone(dt.UTC).date()
    return day.replace(day=1) if period == "month" else day


def period_end(period: str, at: dt.datetime | None = None) -> dt.datetime:
    """The moment (UTC) the period holding ``at`` ends and a new one starts."""
    start = period_start(period, at)
    if period == "month":
        nxt = dt.date(start.year + start.month // 12, start.month % 12 + 1, 1)
    else:
        nxt = start + dt.timedelta(days=1)
    return dt.datetime(nxt.year, nxt.month, nxt.day, tzinfo=dt.UTC)


def seconds_to_reset(period: str, at: dt.datetime | None = None) -> int:
    """Whole seconds until the period resets (at least 1: a ``Retry-After`` value)."""
    at = at or now()
    return max(1, math.ceil((period_end(period, at) - at).total_seconds()))
