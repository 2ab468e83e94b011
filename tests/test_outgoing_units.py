"""Wall 4, the outgoing verifier: the unit a bound is per must be the private read's own unit.

The bounding rules recognise the privacy unit by its column's name (a window partitioned by
``rider_id``, rows grouped by ``rider_id`` then counted, weights ``1 / COUNT(*) OVER (PARTITION
BY rider_id)``).  A column of that name that is something else splits one unit's rows over
several partitions or groups, each bounded, the unit not: another source's column in a join,
an alias over another expression, a star over a join; and a GROUP BY with a second key or
ROLLUP, CUBE, GROUPING SETS puts a unit in several groups.  Each such statement is refused on
both backends; the statements the rewriter writes (the unit alone, the read's own column)
pass.
"""

from __future__ import annotations

import pytest

from analyses.outgoing import Refused, verify
from chorus_py.engine import Engine

BLOCKS = ("CAST('2026-01-01 00:00:00' AS TIMESTAMP) <= t.pickup_time "
          "AND t.pickup_time < CAST('2026-04-01 00:00:00' AS TIMESTAMP)")
# A public source whose rows carry a column named like the unit (each city's trips joined to
# many made-up "rider_id"s: one trip in as many partitions).
FAKE_UNITS = "(SELECT c.city, c.population AS rider_id FROM {s}.cities AS c)"

#: (name, statement over schema {s}): each bounded only per a column that is not the unit.
FOREIGN = {
    "window over a joined source's column": (
        "SELECT SUM(b.fare) AS m0 FROM (SELECT t.fare, ROW_NUMBER() OVER (PARTITION BY "
        f"f.rider_id) AS r FROM {{s}}.trips AS t JOIN {FAKE_UNITS} AS f ON t.city = f.city "
        f"WHERE {BLOCKS}) AS b WHERE b.r <= 3"),
    "window over an alias of another column": (
        "SELECT SUM(b.fare) AS m0 FROM (SELECT a.fare, ROW_NUMBER() OVER (PARTITION BY "
        "a.rider_id) AS r FROM (SELECT t.fare, t.fare AS rider_id FROM {s}.trips AS t "
        f"WHERE {BLOCKS}) AS a) AS b WHERE b.r <= 3"),
    "window over a star of a join": (
        "SELECT SUM(b.fare) AS m0 FROM (SELECT a.fare, ROW_NUMBER() OVER (PARTITION BY "
        "a.rider_id) AS r FROM (SELECT f.*, t.fare FROM {s}.trips AS t JOIN "
        f"{FAKE_UNITS} AS f ON t.city = f.city WHERE {BLOCKS}) AS a) AS b WHERE b.r <= 3"),
    "weights over a joined source's column": (
        "SELECT SUM(w.x) AS m0 FROM (SELECT CAST(1 AS DOUBLE) / COUNT(*) OVER (PARTITION BY "
        f"f.rider_id) AS x FROM {{s}}.trips AS t JOIN {FAKE_UNITS} AS f ON t.city = f.city "
        f"WHERE {BLOCKS}) AS w"),
    "grouped by the unit and another key": (
        "SELECT COUNT(*) AS n FROM (SELECT 1 AS one FROM {s}.trips AS t "
        f"WHERE {BLOCKS} GROUP BY t.rider_id, t.driver_id) AS u"),
    "grouped by the unit with rollup": (
        "SELECT COUNT(*) AS n FROM (SELECT 1 AS one FROM {s}.trips AS t "
        f"WHERE {BLOCKS} GROUP BY ROLLUP (t.rider_id)) AS u"),
    "grouped by the unit's grouping sets": (
        "SELECT COUNT(*) AS n FROM (SELECT 1 AS one FROM {s}.trips AS t "
        f"WHERE {BLOCKS} GROUP BY GROUPING SETS ((t.rider_id), ())) AS u"),
    "grouped by a cube of the unit": (
        "SELECT COUNT(*) AS n FROM (SELECT 1 AS one FROM {s}.trips AS t "
        f"WHERE {BLOCKS} GROUP BY CUBE (t.rider_id)) AS u"),
    "grouped by the unit and a key, then by the key": (
        "SELECT COUNT(*) AS n FROM (SELECT p.d, COUNT(*) AS c FROM (SELECT t.rider_id AS u, "
        f"t.driver_id AS d FROM {{s}}.trips AS t WHERE {BLOCKS} GROUP BY t.rider_id, "
        "t.driver_id) AS p GROUP BY p.d) AS q"),
    "grouped by the unit, then joined": (
        "SELECT COUNT(*) AS n FROM (SELECT 1 AS one FROM {s}.trips AS t "
        f"WHERE {BLOCKS} GROUP BY t.rider_id) AS u JOIN {{s}}.cities AS c ON TRUE"),
    "grouped by the unit renamed from another column": (
        "SELECT COUNT(*) AS n FROM (SELECT p.u FROM (SELECT t.driver_id AS u FROM "
        f"{{s}}.trips AS t WHERE {BLOCKS}) AS p GROUP BY p.u) AS q"),
    "grouped by a joined source's column": (
        "SELECT COUNT(*) AS n FROM (SELECT 1 AS one FROM {s}.trips AS t JOIN "
        f"{FAKE_UNITS} AS f ON t.city = f.city WHERE {BLOCKS} GROUP BY f.rider_id) AS u"),
}

#: The same shapes over the read's own unit column: what the rewriter writes.
OWN = {
    "window over the read's unit": (
        "SELECT SUM(b.fare) AS m0 FROM (SELECT t.fare, ROW_NUMBER() OVER (PARTITION BY "
        f"t.rider_id) AS r FROM {{s}}.trips AS t WHERE {BLOCKS}) AS b WHERE b.r <= 3"),
    "window over the unit through a star": (
        "SELECT SUM(b.fare) AS m0 FROM (SELECT a.fare, ROW_NUMBER() OVER (PARTITION BY "
        "a.rider_id) AS r FROM (SELECT t.* FROM {s}.trips AS t "
        f"WHERE {BLOCKS}) AS a) AS b WHERE b.r <= 3"),
    "window over the read's unit in a join": (
        "SELECT SUM(b.fare) AS m0 FROM (SELECT t.fare, ROW_NUMBER() OVER (PARTITION BY "
        f"t.rider_id) AS r FROM {{s}}.trips AS t JOIN {FAKE_UNITS} AS f ON t.city = f.city "
        f"WHERE {BLOCKS}) AS b WHERE b.r <= 3"),
    "distinct keys per unit, then units per count": (
        "SELECT q.c AS b, COUNT(*) AS n FROM (SELECT p.u, COUNT(*) AS c FROM (SELECT "
        f"t.rider_id AS u, t.driver_id AS d FROM {{s}}.trips AS t WHERE {BLOCKS} GROUP BY "
        "t.rider_id, t.driver_id) AS p GROUP BY p.u) AS q GROUP BY q.c"),
    "grouped by the unit alone": (
        "SELECT COUNT(*) AS n FROM (SELECT 1 AS one FROM {s}.trips AS t "
        f"WHERE {BLOCKS} GROUP BY t.rider_id) AS u"),
}


def _verify(engine: Engine, sql: str) -> None:
    rules = engine.statements.outgoing
    verify(sql.format(s=rules.schema), engine.dialect, rules, "noised_by_proxy",
           frozenset({"trips"}))


@pytest.mark.parametrize("name", list(FOREIGN))
def test_a_bound_per_something_else_than_the_unit_is_refused(engine: Engine, name: str
                                                             ) -> None:
    with pytest.raises(Refused):
        _verify(engine, FOREIGN[name])


@pytest.mark.parametrize("name", list(OWN))
def test_a_bound_per_the_reads_own_unit_passes(engine: Engine, name: str) -> None:
    _verify(engine, OWN[name])
