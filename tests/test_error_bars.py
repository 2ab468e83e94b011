"""Error bars, clamped counts and empty results, end to end (issue 19, parts 2-4), on DuckDB and
Postgres: each noisy cell's 95% interval (``mechanisms.intervals``, wired by
``chorus_py.kinds.analytic.Accuracy``) contains the truth in at least 95% of repeated releases;
counts are never negative; a thresholded query that released nothing says why; a join whose noise
scale is data-dependent gets no interval (its width would show the scale); every front door
carries them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from chorus_py.engine import Engine
from chorus_py.kinds.analytic import Accuracy
from chorus_py.kinds.selection import Choices
from mechanisms.intervals import Interval, NoInterval
from mechanisms.selection_bias import Bias as SelectionBias
from rewriters.pipeline import released_measurements

ALICE = {"analyst": "alice"}

# Fixed bounds and a fixed cap: no bias, so the intervals are about the noise alone.
POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e9
delta_per_block = 0.5
max_epsilon_per_query = 1e5
max_delta_per_query = 1e-3
answer_cache_seconds = 0

[tables.small]
privacy_unit = "person"
max_rows_per_unit = 3
contribution = "fixed"
clipping = "fixed"

[tables.small.columns]
person = {{ type = "int" }}
grp    = {{ type = "text", public_values = ["a", "b", "c"] }}
label  = {{ type = "text" }}
value  = {{ type = "float", lower = 0, upper = 100 }}

[analysts.alice]
"""


@pytest.fixture
def small(scratch: Callable[..., Engine], backend_url: str) -> Engine:
    """60 persons with 3 rows each: group a, b or c by person, value = person (0..59)."""
    double = "DOUBLE" if backend_url.startswith("duckdb") else "DOUBLE PRECISION"
    create = (f"CREATE TABLE small AS SELECT CAST(p AS BIGINT) AS person, "
              f"CASE WHEN p % 3 = 0 THEN 'a' WHEN p % 3 = 1 THEN 'b' ELSE 'c' END AS grp, "
              f"'x' || CAST(p % 2 AS VARCHAR(4)) AS label, CAST(p AS {double}) AS value "
              f"FROM generate_series(0, 59) AS s(p), generate_series(1, 3) AS r(i)")
    return scratch("small", [create], POLICY)


# The truth of each (query, output column), per group: 20 persons per group, 3 rows each.
def _truth() -> dict[str, float]:
    groups = {g: [p for p in range(60) if "abc"[p % 3] == g] for g in "abc"}
    out: dict[str, float] = {}
    for g, persons in groups.items():
        out[f"count/{g}"] = 3 * len(persons)
        out[f"sum/{g}"] = 3.0 * sum(persons)
        out[f"avg/{g}"] = sum(persons) / len(persons)
    return out


def test_intervals_contain_the_truth_95_percent_of_the_time(small: Engine) -> None:
    truth = _truth()
    sql = "SELECT grp, COUNT(*) AS n, SUM(value) AS s, AVG(value) AS a FROM small GROUP BY grp"
    hits = total = 0
    per_column = {"n": [0, 0], "s": [0, 0], "a": [0, 0]}
    for _ in range(60):
        result = small.execute(sql, epsilon=2.0, **ALICE)
        for row, intervals in zip(result.rows, result.intervals(), strict=True):
            assert intervals[0] is None  # the group key
            for name, value, iv, key in (("n", row[1], intervals[1], "count"),
                                         ("s", row[2], intervals[2], "sum"),
                                         ("a", row[3], intervals[3], "avg")):
                assert isinstance(iv, Interval), iv
                assert iv.lower <= value <= iv.upper
                inside = iv.lower <= truth[f"{key}/{row[0]}"] <= iv.upper
                per_column[name][0] += inside
                per_column[name][1] += 1
                hits += inside
                total += 1
    # 540 intervals: at 95% coverage, fewer than 91% inside has probability below 1e-4.
    assert hits / total >= 0.91, per_column
    for name, (inside, n) in per_column.items():
        assert inside / n >= 0.85, (name, per_column)


def test_counts_are_clamped_at_zero_and_their_intervals_too(small: Engine) -> None:
    sql = "SELECT COUNT(*) AS n FROM small WHERE value > 1000"  # no row: the truth is 0
    zeros = covered = 0
    for _ in range(40):
        result = small.execute(sql, epsilon=0.05, **ALICE)
        ((value,),), ((iv,),) = result.rows, result.intervals()
        assert isinstance(value, int) and value >= 0
        assert isinstance(iv, Interval) and 0 <= iv.lower <= value <= iv.upper
        zeros += value == 0
        covered += iv.lower == 0
    # Half the raw noisy counts of 0 are negative: released as 0.  At 95% coverage, fewer
    # than 33 of 40 intervals holding 0 has probability below 1e-3.
    assert zeros >= 10 and covered >= 33, (zeros, covered)


def test_an_empty_thresholded_answer_says_why(small: Engine) -> None:
    # label has no public values: keys are released by a noisy threshold (delta > 0).  At a
    # tiny epsilon the threshold is far above the 30 persons of each label.
    result = small.execute("SELECT label, COUNT(*) FROM small GROUP BY label", epsilon=0.01,
                           delta=1e-6, **ALICE)
    assert result.rows == []
    assert any("No group was released" in w and "need epsilon" in w
               for w in result.report.warnings), result.report.warnings
    report = small.explain("SELECT label, COUNT(*) FROM small GROUP BY label", epsilon=0.01,
                           delta=1e-6, **ALICE)
    assert any("will mostly be hidden" in w for w in report.warnings), report.warnings


def test_a_derived_column_gets_an_interval_and_keys_none(small: Engine) -> None:
    result = small.execute("SELECT grp, SUM(value) / COUNT(*) AS mean, 2 * COUNT(*) AS twice "
                           "FROM small GROUP BY grp", epsilon=5.0, **ALICE)
    for row, (key, mean, twice) in zip(result.rows, result.intervals(), strict=True):
        assert key is None
        assert isinstance(mean, Interval | NoInterval) and isinstance(twice, Interval)
        assert twice.lower <= row[2] <= twice.upper
        assert math.isclose(twice.upper - row[2], row[2] - twice.lower, rel_tol=0.2)


def test_public_answers_have_no_intervals(engine: Engine) -> None:
    result = engine.execute("SELECT COUNT(*) FROM cities", **ALICE)
    assert result.intervals() == ((None,),)
    assert result.to_dict()["intervals"] == [[None]]


def test_the_dbapi_cursor_and_json_carry_the_intervals(small: Engine) -> None:
    result = small.execute("SELECT COUNT(*) AS n FROM small", epsilon=1.0, **ALICE)
    cell = result.to_dict()["intervals"][0][0]
    assert cell["text"].endswith("(noise)") and cell["lower"] <= result.rows[0][0] <= cell["upper"]
    assert cell["method"] == "exact" and cell["bias"] == []



def test_the_bias_of_chosen_caps_and_bounds_widens_the_interval_on_its_side(
        small: Engine) -> None:
    """How an answer's interval takes the bias of the private choices (``Accuracy._bias``):
    a COUNT released as a total loses the rows above the cap, a SUM also its clipping loss,
    an AVG only the clipping loss; each interval widens upward by its share, never down."""
    _, prepared = small.prepare("SELECT COUNT(*) AS n, SUM(value) AS s, AVG(value) AS a "
                                "FROM small", "alice", 1.0)
    detail = prepared.detail
    summed = next(m for m in detail.query.measurements if m.kind == "sum")
    chosen = Choices(3, (), None, cap_bias=SelectionBias(0.02, 0.05),
                     clip_bias=((summed.argument.sql(), SelectionBias(0.01, 0.03)),))
    ids = released_measurements(detail.query)
    noisy = {"count": 180.0, "sum": 5310.0}
    values = tuple(noisy["count"] if next(m for m in detail.query.measurements
                                           if m.id == mid).kind == "count" else noisy["sum"]
                   for mid in ids)
    (n, s, a), = Accuracy(detail.query, detail.plan, [(180, 5310.0, 29.5)], (values,),
                          chosen).intervals()
    assert [b.reason for b in n.bias] == ["person rows above the cap"]
    assert n.upper == pytest.approx(n.noise_upper / 0.95) and n.lower == n.noise_lower
    assert s.bias[0].fraction == pytest.approx(1 - 0.95 * 0.97)
    assert "rows above the cap" in s.bias[0].reason and "clipped" in s.bias[0].reason
    assert [b.reason for b in a.bias] == ["values clipped to [0, 100]"]
    assert a.bias[0].fraction == pytest.approx(0.03)

