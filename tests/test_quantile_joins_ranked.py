"""Quantiles over joins read the ranked copies of their private tables (issue 23,
``rewriters.quantiles.quantile_join_histogram`` through ``rewriters.joins.join_rows``).

The copies must change nothing but speed: each occurrence keeps min(c_u, cap) of its c_u rows
that pass its own conditions, chosen uniformly among them.  The histogram's NOT NULL test on
the quantiled value is one of those conditions: the side it reads cannot keep its stored ranks
<= cap by a plain scan (a unit with NULL values among its lowest ranks would keep fewer than
min(c_u, cap) counted rows), only a side the test does not read may.  Small skewed data on
both backends: units of 1 to 40 events, NULL values in a light and in two heavy units, one
people row per person with a NULL age.  An event's value names its unit and its index
(v = person + (i + 0.5) / 100: one bin per event, unit = bin // 100) and an age names its
person (bin 1000 p + 50), so the kept rows of every unit can be read off the histogram.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from analyses.outgoing import Refused, verify
from chorus_py.engine import Engine
from chorus_py.kinds.quantile import QuantileDetail
from chorus_py.stores.samples import BoundedSamples
from tests.conftest import tables_with_rows
from tests.test_ranked_joins import _heavy_threshold_moved, _light_alone, _no_bound

#: Events per person: light units up to the cap and heavier ones.
SIZES = {1: 1, 2: 2, 3: 3, 4: 5, 5: 8, 6: 40}
K = 3
DAY1, DAY2 = "2026-01-01 12:00:00", "2026-01-02 12:00:00"

POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 100000.0
delta_per_block = 1e-3
max_epsilon_per_query = 5000.0
max_delta_per_query = 1e-4
default_delta = 1e-8
noise = "proxy"

[tables.{ev}]
privacy_unit = "person"
max_rows_per_unit = {k}
contribution = "fixed"
ranked_copy = {ranked}
block = {{ column = "t", size = "1 day", start = "2026-01-01", end = "2026-01-03" }}

[tables.{ev}.columns]
id = {{ type = "int" }}
person = {{ type = "int" }}
v = {{ type = "float", lower = 0, upper = 100 }}
t = {{ type = "timestamp" }}

[tables.{pp}]
privacy_unit = "person"
max_rows_per_unit = 1
contribution = "fixed"
ranked_copy = {ranked}

[tables.{pp}.columns]
person = {{ type = "int", private_id = true }}
age = {{ type = "float", lower = 0, upper = 100 }}

[analysts.alice]
"""

Event = tuple[int, int, float | None, str]


def _null(person: int, i: int) -> bool:
    """NULL values: person 2's second event (a light unit), half of person 5's 8 events and
    three in four of person 6's 40 (heavy units whose lowest stored ranks are often NULL)."""
    return (person == 2 and i == 1) or (person == 5 and i % 2 == 0) \
        or (person == 6 and i % 4 != 0)


def _events() -> list[Event]:
    """(id, person, v, t): v = person + (i + 0.5) / 100 (NULL as ``_null`` says); even
    indexes on day 1, odd ones on day 2."""
    out, next_id = [], 1
    for person, n in SIZES.items():
        for i in range(n):
            v = None if _null(person, i) else person + (i + 0.5) / 100
            out.append((next_id, person, v, DAY1 if i % 2 == 0 else DAY2))
            next_id += 1
    return out


#: One people row per person 1..7 (7 has no events); person 3's age is NULL.
AGES: dict[int, float | None] = {p: None if p == 3 else 10 * p + 0.5 for p in range(1, 8)}

_TABLES = {  # prefix: (columns in Postgres types, rows)
    "ev": ("id BIGINT, person BIGINT, v DOUBLE PRECISION, t TIMESTAMP", _events),
    "pp": ("person BIGINT, age DOUBLE PRECISION", lambda: list(AGES.items())),
}

Tables = tuple[str, str, str]  # URL, events, people


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def tables(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tables]:
    made = {prefix: (columns, rows()) for prefix, (columns, rows) in _TABLES.items()}
    with tables_with_rows(request, tmp_path, "qjoins", made) as (url, names):
        yield url, names["ev"], names["pp"]


@pytest.fixture
def engines(tables: Tables, policy_engine: Callable[[str], Engine]) -> Callable[..., Engine]:
    def make(ranked: bool = True, k: int = K) -> Engine:
        url, ev, pp = tables
        return policy_engine(POLICY.format(url=url, ev=ev, pp=pp, k=k,
                                           ranked="true" if ranked else "false"))

    return make


def _statement(engine: Engine, sql: str) -> str:
    """The histogram statement the quantile kind runs (one quantiled value)."""
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    detail = prepared.detail
    assert isinstance(detail, QuantileDetail)
    ((_, statement),) = detail.histograms
    return statement


def _histogram(engine: Engine, sql: str) -> dict[int, int]:
    """The exact histogram (never released): bin -> join rows."""
    out: collections.Counter[int] = collections.Counter()
    for b, n in engine.backend.run(_statement(engine, sql)).rows:
        out[int(b)] += int(n)
    return dict(out)


def _v_bin(person: int, i: int) -> int:
    return 100 * person + i


def _age_bin(person: int) -> int:
    return 1000 * person + 50


Passing = Callable[[int, int, str], bool]  # (person, index, day) -> the event passes


def _counted(passing: Passing) -> dict[int, list[int]]:
    """Per person, the bins of their events that pass and have a value (those the histogram
    of e.v may count)."""
    out: dict[int, list[int]] = collections.defaultdict(list)
    for person, n in SIZES.items():
        for i in range(n):
            day = DAY1 if i % 2 == 0 else DAY2
            if passing(person, i, day) and not _null(person, i):
                out[person].append(_v_bin(person, i))
    return out


def _rows_per_person(passing: Passing) -> dict[int, int]:
    """Per person, their events that pass, NULL values included (the age's histogram does not
    test the events' values)."""
    out: collections.Counter[int] = collections.Counter()
    for person, n in SIZES.items():
        for i in range(n):
            if passing(person, i, DAY1 if i % 2 == 0 else DAY2):
                out[person] += 1
    return dict(out)


def _age_histogram(passing: Passing, cap: int, people: Callable[[int], bool]
                   ) -> dict[int, int]:
    """The age's histogram: each person with an age (passing ``people``) weighs min(c_u, cap)
    of their passing events."""
    return {_age_bin(p): min(c, cap) for p, c in _rows_per_person(passing).items()
            if AGES[p] is not None and people(p)}


def _every(person: int, i: int, day: str) -> bool:
    return True


def _day2(person: int, i: int, day: str) -> bool:
    return day == DAY2


def _young(person: int) -> bool:
    age = AGES[person]
    return age is not None and age < 45


# (query over {ev} e, {pp} p; what is quantiled: "v" or "age"; the events that pass; the
# people that pass; whether each side reads its copy whole: events, people)
CASES = [
    # The NULL test reads the events: they are ranked after it, the people read whole.
    ("SELECT MEDIAN(e.v) FROM {ev} e JOIN {pp} p ON e.person = p.person",
     "v", _every, lambda p: True, (False, True)),
    # The NULL test reads the people: the events (no filter, every block) are read whole.
    ("SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY p.age) FROM {ev} e JOIN {pp} p "
     "ON e.person = p.person", "age", _every, lambda p: True, (True, False)),
    # A filter on the people side: both sides ranked after their conditions.
    ("SELECT MEDIAN(e.v) FROM {ev} e JOIN {pp} p ON e.person = p.person WHERE p.age < 45",
     "v", _every, _young, (False, False)),
    # The claimed blocks alone filter the events (day 2 does not cover the copy).
    ("SELECT MEDIAN(p.age) FROM {ev} e JOIN {pp} p ON e.person = p.person "
     "WHERE e.t >= TIMESTAMP '2026-01-02 00:00:00'", "age", _day2, lambda p: True,
     (False, False)),
]
IDS = ["v-events-filtered", "age-events-whole", "v-people-filtered", "age-day-2"]


def _expected(what: str, passing: Passing, people: Callable[[int], bool], cap: int
              ) -> dict[int, int]:
    """The histogram when ``cap`` binds no unit (every counted row kept)."""
    if what == "age":
        return _age_histogram(passing, cap, people)
    return {b: 1 for p, bins in _counted(passing).items() if people(p) for b in bins}


def _assert_shape(text: str, tables: Tables, whole: tuple[bool, bool]) -> None:
    """Each side reads its copy: whole by its stored ranks, filtered as light UNION ALL
    heavy."""
    _, ev, pp = tables
    for table, reads_whole in zip((ev, pp), whole, strict=True):
        copy = re.search(rf'"{table}__ranked_\w+" AS (\w+)', text)
        assert copy is not None, text
        alias = copy.group(1)
        assert (f"{alias}.__chorus_unit_rows <=" in text) is not reads_whole, text
        assert (f"{alias}.__chorus_rank <=" in text) is reads_whole, text


@pytest.mark.parametrize(("query", "what", "passing", "people", "whole"), CASES, ids=IDS)
def test_histograms_are_the_hand_counts_when_caps_do_not_bind(
        tables: Tables, engines: Callable[..., Engine], query: str, what: str,
        passing: Passing, people: Callable[[int], bool], whole: tuple[bool, bool]) -> None:
    """Cap 40 on the events: every unit's counted rows are kept, by the copies and by ranking
    per query alike (``ranked_copy = false``), so the histograms are the hand count."""
    _, ev, pp = tables
    sql = query.format(ev=ev, pp=pp)
    ranked, per_query = engines(True, k=40), engines(False, k=40)
    _assert_shape(_statement(ranked, sql), tables, whole)
    assert "__ranked_" not in _statement(per_query, sql)
    expected = _expected(what, passing, people, 40)
    assert _histogram(ranked, sql) == expected
    assert _histogram(per_query, sql) == expected


@pytest.mark.parametrize(("query", "what", "passing", "people", "whole"), CASES, ids=IDS)
def test_each_unit_keeps_min_of_its_counted_rows_per_side(
        tables: Tables, engines: Callable[..., Engine], query: str, what: str,
        passing: Passing, people: Callable[[int], bool], whole: tuple[bool, bool]) -> None:
    """Cap 3: each person weighs min(c_u, 3) of the rows the histogram counts, only rows it
    may count, never more.  For e.v, c_u counts the non-NULL values (person 6 keeps 3 of its
    10, though three in four of its stored ranks hold a NULL); for the age, every event."""
    _, ev, pp = tables
    sql = query.format(ev=ev, pp=pp)
    for engine in (engines(True), engines(False)):
        found = _histogram(engine, sql)
        if what == "age":
            assert found == _age_histogram(passing, K, people)
            continue
        counted = {p: bins for p, bins in _counted(passing).items() if people(p)}
        per_person: collections.Counter[int] = collections.Counter()
        for b, n in found.items():
            assert n == 1 and b in counted[b // 100], (b, found)
            per_person[b // 100] += n
        assert dict(per_person) == {p: min(len(bins), K) for p, bins in counted.items()}


def test_the_answer_and_report_are_those_of_ranking_per_query(
        tables: Tables, engines: Callable[..., Engine]) -> None:
    _, ev, pp = tables
    sql = f"SELECT MEDIAN(e.v) FROM {ev} e JOIN {pp} p ON e.person = p.person"
    ranked, per_query = engines(True), engines(False)
    result = ranked.execute(sql, "alice", epsilon=2000.0)
    other = per_query.execute(sql, "alice", epsilon=2000.0)
    assert result.report.stability == other.report.stability == K
    assert result.report.measurements == other.report.measurements
    assert result.report.notes == other.report.notes
    assert 1 <= result.rows[0][0] <= 7


def test_a_changed_table_is_never_read_through_its_old_copy(
        tables: Tables, engines: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BoundedSamples, "build_in_background", True)  # as `chorus serve`
    url, ev, pp = tables
    engine = engines(True)
    sql = f"SELECT MEDIAN(e.v) FROM {ev} e JOIN {pp} p ON e.person = p.person"
    engine.prepare(sql, "alice", epsilon=1.0)
    engine.samples.wait()
    first = _statement(engine, sql)
    assert f"{ev}__ranked_" in first and 700 not in _histogram(engine, sql)
    # Person 7's first event: bin 700.
    statement = f"INSERT INTO {ev} VALUES (1000, 7, 7.005, TIMESTAMP '{DAY1}')"
    if url.startswith("duckdb"):
        engine.backend.run_owned([statement])
    else:
        with psycopg.connect(url, autocommit=True) as con:
            con.execute(statement)
            con.execute("SELECT pg_stat_force_next_flush()")  # the version's counters
    for _ in range(50):  # the statistics collector may lag a little on Postgres
        text = _statement(engine, sql)
        if text != first:
            break
        time.sleep(0.1)
    # Until the new copy is built the events are ranked per query (the people's copy stays).
    assert text != first and f"{ev}__ranked_" not in text and f"{pp}__ranked_" in text
    assert _histogram(engine, sql)[700] == 1
    engine.samples.wait()
    text = _statement(engine, sql)
    assert f"{ev}__ranked_" in text and text != first
    assert _histogram(engine, sql)[700] == 1


@pytest.mark.parametrize(("mutation", "reason"), [
    (_no_bound, "contribution bounding"),
    (_heavy_threshold_moved, "not disjoint"),
    (_light_alone, "without its heavy branch"),
], ids=["no-bound", "heavy-threshold-moved", "light-alone"])
def test_the_verifier_passes_the_histogram_and_refuses_its_near_misses(
        tables: Tables, engines: Callable[..., Engine], mutation: Callable[[str], str],
        reason: str) -> None:
    """The histogram over one side ranked after the NULL test and one read whole."""
    _, ev, pp = tables
    engine = engines(True)
    sql = _statement(engine, f"SELECT MEDIAN(e.v) FROM {ev} e JOIN {pp} p "
                             "ON e.person = p.person")
    assert "UNION ALL" in sql and "__chorus_rank <=" in sql
    read = frozenset({ev, pp})
    verify(sql, engine.dialect, engine.statements.outgoing, "noised_by_proxy", read)
    with pytest.raises(Refused, match=reason):
        verify(mutation(sql), engine.dialect, engine.statements.outgoing, "noised_by_proxy",
               read)
