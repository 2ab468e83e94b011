"""Wall 4, the outgoing verifier: the key-release gate counts each unit at most once per group.

Keys that come from rows are released only where a noisy count clears a threshold calibrated
for a count to which a new unit adds at most 1 per group.  The verifier once accepted any noisy
column compared to a literal: a gate over ``COUNT(*)`` (one unit's many rows) or a distinct
count of another column would let one person's rows alone release a key.  Now the gate must
be, in every aggregation it adds up, ``COUNT(DISTINCT`` the reads' own unit column``)`` (in a
join, every other read with a unit joined to it on units), a grouped twin's count of its marks
grouped by exactly its stored keys, or ``COUNT(*)`` where no read has a unit.  Real rewrites
(both backends, noise in SQL) pass; each tampered gate is refused.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

import pytest
import sqlglot
from sqlglot import exp

from analyses.outgoing import Refused, verify
from chorus_py.engine import Engine
from chorus_py.errors import InternalError
from chorus_py.kinds import quantile as quantile_kind
from rewriters import pipeline
from tests.conftest import nothing_spent

FILTERED = "SELECT driver_id, COUNT(*) FROM trips WHERE fare > 1 GROUP BY driver_id"
WHOLE = "SELECT driver_id, COUNT(*) FROM trips GROUP BY driver_id"  # the grouped twin's marks
SELF_JOIN = ("SELECT a.driver_id, COUNT(*) FROM trips a JOIN trips b ON a.rider_id = b.rider_id "
             "GROUP BY a.driver_id")
EVENT = "SELECT page, COUNT(*) FROM visits GROUP BY page"

DISTINCT_GATE = re.compile(r"COUNT\(DISTINCT (\w+)\.rider_id\) AS t0")
MARK_GATE = re.compile(r"COUNT\(CASE WHEN (\w+)\.__chorus_rank = \w+\.__chorus_gscore THEN "
                       r"\w+\.rider_id END\) AS t0")


def _statement(engine: Engine, query: str) -> str:
    text = engine.explain(query, analyst="alice", epsilon=1.0, delta=1e-6).rewritten_sql
    assert text is not None and " > " in text.rsplit("FROM chorus_noisy", 1)[1]
    return text


def _verify(engine: Engine, sql: str, table: str = "trips") -> None:
    verify(sql, engine.dialect, engine.statements.outgoing, "noised_in_sql",
           frozenset({table}))


def _gate(pattern: re.Pattern[str], replacement: Callable[[str], str], count: int = 0
          ) -> Callable[[str], str]:
    """Replace the gate (every occurrence, or the first ``count``) by ``replacement(alias)``."""
    def tamper(sql: str) -> str:
        out, n = pattern.subn(lambda m: replacement(m.group(1)) + " AS t0", sql, count=count)
        assert n, "the gate is not in the statement"
        return out
    return tamper


#: Tampered gates of a filtered query (a ranked copy's parts or branches, each counting
#: COUNT(DISTINCT trips.rider_id)); the first part's alone is enough.  Then of a whole one
#: (the grouped twin's marks), then of a self-join on the unit.
FILTERED_TAMPERS = {
    "rows": _gate(DISTINCT_GATE, lambda a: "COUNT(*)"),
    "non-null units": _gate(DISTINCT_GATE, lambda a: f"COUNT({a}.rider_id)"),
    "distinct fares": _gate(DISTINCT_GATE, lambda a: f"COUNT(DISTINCT {a}.fare)"),
    "distinct drivers": _gate(DISTINCT_GATE, lambda a: f"COUNT(DISTINCT {a}.driver_id)"),
    "one part's rows": _gate(DISTINCT_GATE, lambda a: "COUNT(*)", count=1),
    "distinct stored ranks": _gate(DISTINCT_GATE, lambda a: f"COUNT(DISTINCT {a}.__chorus_rank)"),
}


def _other_keys_twin(sql: str) -> str:
    """The same statement over the grouped twin of other key columns (city): its marks are one
    per (unit, city), several per (unit, driver)."""
    digest = hashlib.sha256(b"city").hexdigest()[:8]
    out, n = re.subn(r"(__ranked_[0-9a-f]{16}_g)[0-9a-f]{8}", rf"\g<1>{digest}", sql)
    assert n
    return out


def _renamed_score(sql: str) -> str:
    """The twin's reader passes its stored rank on as the score: every row marked."""
    out, n = re.subn(r"SELECT (\w+)\.\* FROM (chorus_private\.\"\w+_g[0-9a-f]{8}\")",
                     r"SELECT \1.*, \1.__chorus_rank AS __chorus_gscore FROM \2", sql)
    assert n
    return out


WHOLE_TAMPERS = {
    "rows": _gate(MARK_GATE, lambda a: "COUNT(*)"),
    "marks of another unit column": lambda sql: sql.replace(
        "__chorus_gscore THEN trips.rider_id END", "__chorus_gscore THEN trips.driver_id END"),
    "rank against the group rank": lambda sql: sql.replace(
        "trips.__chorus_rank = trips.__chorus_gscore",
        "trips.__chorus_rank = trips.__chorus_grank"),
    "a twin of other keys": _other_keys_twin,
    "the score renamed from the rank": _renamed_score,
    "distinct drivers": _gate(MARK_GATE, lambda a: f"COUNT(DISTINCT {a}.driver_id)"),
}

SELF_JOIN_TAMPERS = {
    "rows": _gate(DISTINCT_GATE, lambda a: "COUNT(*)"),
    "distinct drivers": _gate(DISTINCT_GATE, lambda a: f"COUNT(DISTINCT {a}.driver_id)"),
    # Joined on a driver and a rider: a joined row holds two people's rows.
    "joined on another column": lambda sql: sql.replace('ON "a"."rider_id" = "b"."rider_id"',
                                                        'ON "a"."driver_id" = "b"."rider_id"'),
    "joined on nothing": lambda sql: sql.replace('ON "a"."rider_id" = "b"."rider_id"',
                                                 "ON TRUE"),
}


def test_real_gates_pass(engine: Engine) -> None:
    for query in (FILTERED, WHOLE, SELF_JOIN):
        _verify(engine, _statement(engine, query))
    _verify(engine, _statement(engine, EVENT), "visits")


def test_the_gates_are_what_the_tampering_expects(engine: Engine) -> None:
    assert DISTINCT_GATE.search(_statement(engine, FILTERED))
    assert MARK_GATE.search(_statement(engine, WHOLE))
    assert DISTINCT_GATE.search(_statement(engine, SELF_JOIN))


#: (query, what was tampered, the tampering) for each tampered gate.
TAMPERED = [(query, name, tamper) for query, tampers in (
    (FILTERED, FILTERED_TAMPERS), (WHOLE, WHOLE_TAMPERS), (SELF_JOIN, SELF_JOIN_TAMPERS))
    for name, tamper in tampers.items()]


@pytest.mark.parametrize(("query", "name", "tamper"), TAMPERED,
                         ids=[f"{q.split(' FROM ')[1][:12]}: {n}" for q, n, _ in TAMPERED])
def test_a_tampered_gate_is_refused(engine: Engine, query: str, name: str,
                                    tamper: Callable[[str], str]) -> None:
    sql = _statement(engine, query)
    tampered = tamper(sql)
    assert tampered != sql
    with pytest.raises(Refused, match="threshold"):
        _verify(engine, tampered)


def test_the_other_side_of_a_join_on_units_counts_the_same_units(engine: Engine) -> None:
    """b.rider_id is b's own unit, joined to a's on units: the same people."""
    sql = _statement(engine, SELF_JOIN)
    _verify(engine, DISTINCT_GATE.sub("COUNT(DISTINCT b.rider_id) AS t0", sql))


def test_an_event_level_gate_counts_rows_not_a_column(engine: Engine) -> None:
    """Visits have no unit: each row is one, so the gate is COUNT(*); a distinct count of a
    column (pages) is not a count of rows."""
    sql = _statement(engine, EVENT)
    assert "COUNT(*) AS m0" in sql and "WHERE m0 > " in sql
    with pytest.raises(Refused, match="threshold"):
        _verify(engine, sql.replace("COUNT(*) AS m0", "COUNT(DISTINCT visits.page) AS m0"),
                "visits")


#: Thresholded queries whose measurements are other aggregates than the gate.
MANY = [
    "SELECT driver_id, COUNT(*), SUM(fare), AVG(distance_km) FROM trips WHERE fare > 1 "
    "GROUP BY driver_id",
    "SELECT driver_id, COUNT(*), SUM(fare), COUNT(fare) FROM trips GROUP BY driver_id",
    "SELECT a.driver_id, COUNT(*), SUM(b.fare) FROM trips a JOIN trips b "
    "ON a.rider_id = b.rider_id GROUP BY a.driver_id",
]


@pytest.mark.parametrize("query", MANY)
def test_no_other_aggregate_of_the_statement_passes_as_the_gate(engine: Engine, query: str
                                                                ) -> None:
    """The gate's expression, in every aggregation, replaced by each other aggregate output of
    that aggregation (a count of rows, a sum, a count of a column): each is refused."""
    sql = _statement(engine, query)
    _verify(engine, sql)
    tree = sqlglot.parse_one(sql, read=engine.dialect)
    gates = [a for a in tree.find_all(exp.Alias) if a.alias == "t0"
             and isinstance(a.parent, exp.Select) and a.find(exp.AggFunc) is not None
             and a.this.find(exp.Column) is not None and "chorus_parts" not in a.sql()]
    assert gates
    others = {o.this.sql(engine.dialect) for g in gates for o in g.parent.expressions
              if isinstance(o, exp.Alias) and o.alias.startswith("m")
              and o.find(exp.AggFunc) is not None}
    assert others
    for other in sorted(others):
        tampered = tree.copy()
        for gate in [a for a in tampered.find_all(exp.Alias) if a.alias == "t0"
                     and isinstance(a.parent, exp.Select) and "chorus_parts" not in a.sql()
                     and a.find(exp.AggFunc) is not None]:
            gate.set("this", sqlglot.parse_one(other, read=engine.dialect))
        with pytest.raises(Refused, match="threshold"):
            _verify(engine, tampered.sql(engine.dialect))


@pytest.mark.parametrize("noise", ["sql", "proxy"])
@pytest.mark.parametrize("query", [FILTERED, WHOLE, SELF_JOIN])
def test_a_rewriter_that_gates_on_rows_is_stopped_before_the_database(
        backend_url: str, make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch,
        noise: str, query: str) -> None:
    """A rewriter bug simulated: the gate built as COUNT(*) of the rows.  The engine's hook
    refuses the statement (noise in SQL: its threshold; in the proxy: the column the proxy's
    threshold reads) before it runs, and nothing is spent."""
    engine = make_engine(backend_url, noise=noise)
    monkeypatch.setattr(pipeline, "_distinct_units",
                        lambda alias, unit, marked: exp.Count(this=exp.Star()))
    with pytest.raises(InternalError, match="threshold"):
        engine.execute(query, analyst="alice", epsilon=1.0, delta=1e-6)
    assert nothing_spent(engine)


def test_a_quantiles_units_gate_that_counts_rows_is_stopped(
        backend_url: str, make_engine: Callable[..., Engine],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Quantiles by a thresholded key with automatic caps: the proxy gates the keys on a
    separate statement's distinct units per group (``rewriters.quantiles.
    quantile_group_units``, its output ``n``).  Built as COUNT(*) of the rows (a simulated
    bug), the statement is refused before it runs and nothing is spent; built right, the
    query is answered."""
    query = "SELECT driver_id, MEDIAN(fare) FROM trips GROUP BY driver_id"
    engine = make_engine(backend_url, contribution="auto")
    engine.execute(query, analyst="alice", epsilon=1.0, delta=1e-6)
    built = quantile_kind.quantile_group_units

    def rows_per_group(*args: object, **kwargs: object) -> exp.Select:
        tree = built(*args, **kwargs)  # type: ignore[arg-type]
        next(c for c in tree.find_all(exp.Count) if c.find(exp.Distinct)).replace(
            exp.Count(this=exp.Star()))
        return tree

    other = make_engine(backend_url, contribution="auto")
    monkeypatch.setattr(quantile_kind, "quantile_group_units", rows_per_group)
    with pytest.raises(InternalError, match="threshold"):
        other.execute(query, analyst="alice", epsilon=1.0, delta=1e-6)
    assert nothing_spent(other)
