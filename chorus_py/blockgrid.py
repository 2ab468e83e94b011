"""Where time blocks begin and end, and what they are called: the grid of a block ``size``.

A grid is defined for every instant (naive UTC; a ``timestamp`` without time zone is read as
UTC), from a fixed origin, never from the data or from the schedule's ``start``: so editing
``start`` or ``end`` adds or removes whole blocks and never creates a block that overlaps an old
one (which would bring fresh budget for the same rows).  Three kinds:

- fixed steps, ``"N seconds|minutes|hours|days"``: a boundary every step counted from
  1970-01-01 00:00 UTC.  Block ids are the start's date (``2026-01-05``) when the step is whole
  days, else its minute (``2026-01-05T06:00``).
- weeks, ``"N weeks"``: a boundary every N * 7 days from the first ``week_start`` day on or
  after 1970-01-01 (ISO weeks: Monday, the default).  One-week Monday blocks are called by their
  ISO week (``2026-W03``: the week of 2026-01-12); other weeks by their first day
  (``2026-01-01``).  Before weeks had a start day they began on Thursdays, as 1970-01-01 did:
  ``week_start = "thursday"`` keeps those blocks and their ids.
- calendar months, ``"N months"`` / ``"N years"``: the first of every Nth month counted from
  January 1970 (``"3 months"``: quarters from January; ``"1 year"``: years).  Ids are the first
  month (``2026-01``), or the year (``2026``) for whole years.

Each grid also names itself (``scheme``): the ledger records the scheme each table's blocks
were cut by, and refuses a policy that cuts them another way (``budget.ledger``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

_EPOCH = datetime(1970, 1, 1)  # a Thursday
_SIZE_RE = re.compile(r"^\s*([1-9]\d*)\s*(second|minute|hour|day|week|month|year)s?\s*$")
_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 7 * 86400}
_MONTH_ID = re.compile(r"^(\d{4})-(\d{2})$")
_YEAR_ID = re.compile(r"^(\d{4})$")
_ISO_WEEK_ID = re.compile(r"^(\d{4})-W(\d{2})$")


@dataclass(frozen=True)
class FixedGrid:
    """Boundaries every ``step`` from ``origin``: ``origin + n * step`` for every integer n."""

    origin: datetime
    step: timedelta
    iso_weeks: bool = False  # ids as ISO weeks (one-week blocks starting on Mondays)

    def boundary(self, n: int) -> datetime:
        """The n-th boundary (n = 0 at the origin; negative before it)."""
        return self.origin + self.step * n

    def index(self, point: datetime) -> int:
        """The n with ``boundary(n) <= point < boundary(n + 1)``."""
        return (point - self.origin) // self.step

    def label(self, n: int) -> str:
        """The id of the block starting at boundary n (without the table)."""
        start = self.boundary(n)
        if self.iso_weeks:
            year, week, _ = start.isocalendar()
            return f"{year}-W{week:02d}"
        if self.step % timedelta(days=1) == timedelta(0):
            return start.date().isoformat()
        return start.isoformat(timespec="minutes")

    def index_of_label(self, label: str) -> int | None:
        """The n whose block is called ``label``, or None when no block of this grid is."""
        try:
            if self.iso_weeks:
                match = _ISO_WEEK_ID.match(label)
                if match is None:
                    return None
                day = date.fromisocalendar(int(match.group(1)), int(match.group(2)), 1)
                start = datetime(day.year, day.month, day.day)
            else:
                start = datetime.fromisoformat(label)
        except ValueError:
            return None
        n = self.index(start)
        return n if self.boundary(n) == start and self.label(n) == label else None

    @property
    def scheme(self) -> str:
        """How this grid cuts time, in words (recorded by the ledger)."""
        seconds = int(self.step.total_seconds())
        if seconds % (7 * 86400) == 0:
            return f"{_count(seconds // (7 * 86400), 'week')} from " \
                   f"{weekday_name(self.origin)} 00:00 UTC"
        unit = next(u for u in ("day", "hour", "minute", "second") if seconds % _SECONDS[u] == 0)
        return f"{_count(seconds // _SECONDS[unit], unit)} from " \
               f"{self.origin.isoformat(sep=' ', timespec='minutes')} UTC"


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}{'s' * (n != 1)}"


@dataclass(frozen=True)
class MonthGrid:
    """Calendar months: boundaries on the first of every ``months``-th month from January 1970."""

    months: int

    def boundary(self, n: int) -> datetime:
        """The first day of month ``n * months`` counted from January 1970."""
        year, month = divmod(n * self.months, 12)
        return datetime(1970 + year, month + 1, 1)

    def index(self, point: datetime) -> int:
        """The n with ``boundary(n) <= point < boundary(n + 1)``."""
        return ((point.year - 1970) * 12 + point.month - 1) // self.months

    def label(self, n: int) -> str:
        """``2026-01`` (or ``2026`` for whole years)."""
        start = self.boundary(n)
        if self.months % 12 == 0:
            return f"{start.year:04d}"
        return f"{start.year:04d}-{start.month:02d}"

    def index_of_label(self, label: str) -> int | None:
        """The n whose block is called ``label``, or None when no block of this grid is."""
        match = _MONTH_ID.match(label) or _YEAR_ID.match(label)
        if match is None:
            return None
        month = int(match.group(2)) if match.lastindex == 2 else 1
        if not 1 <= month <= 12:
            return None
        n = self.index(datetime(int(match.group(1)), month, 1))
        return n if self.label(n) == label and self.boundary(n).month == month else None

    @property
    def scheme(self) -> str:
        """How this grid cuts time, in words (recorded by the ledger)."""
        return f"{_count(self.months, 'calendar month')} from 1970-01 (UTC)"


Grid = FixedGrid | MonthGrid


def is_time_size(size: str) -> bool:
    """True when ``size`` names a time window ("1 day", "1 week", "1 month", ...)."""
    return _SIZE_RE.match(size) is not None


def is_week_size(size: str) -> bool:
    """True when ``size`` is a number of weeks (the sizes ``week_start`` applies to)."""
    match = _SIZE_RE.match(size)
    return match is not None and match.group(2) == "week"


def grid_for(size: str, week_start: str = "monday") -> Grid:
    """The grid of a time ``size``; ``week_start`` (a day name) places week boundaries."""
    match = _SIZE_RE.match(size)
    if match is None:
        raise ValueError(f"block size {size!r} is not a time window")
    count, unit = int(match.group(1)), match.group(2)
    if unit in ("month", "year"):
        return MonthGrid(count * (12 if unit == "year" else 1))
    if unit == "week":
        # The first week_start day on or after 1970-01-01 (a Thursday, weekday 3).
        origin = _EPOCH + timedelta(days=(WEEKDAYS.index(week_start) - 3) % 7)
        return FixedGrid(origin, timedelta(weeks=count),
                         iso_weeks=count == 1 and week_start == "monday")
    return FixedGrid(_EPOCH, timedelta(seconds=count * _SECONDS[unit]))


def weekday_name(moment: datetime) -> str:
    """``"Thursday"`` etc. (for error messages)."""
    return WEEKDAYS[moment.weekday()].capitalize()


__all__ = ["WEEKDAYS", "FixedGrid", "Grid", "MonthGrid", "grid_for", "is_time_size",
           "is_week_size", "weekday_name"]
