"""DP quantiles end to end (``chorus_py.kinds.quantile``) on DuckDB and Postgres: answers near
the true quantile on small skewed tables, hand-derived sensitivities in the report, the charge,
one histogram statement per quantiled column, and refusals that name the mode that answers."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import sqlglot

from analyses.quantiles import is_quantile, may_ask_quantiles
from analyses.trees import dialect_named
from chorus_py.engine import Engine
from chorus_py.errors import InvalidParameter, NotSupportedError, QueryRefused
from tests.conftest import nothing_spent

ALICE = {"analyst": "alice"}

# 200 units; unit u has (u % 3) + 1 rows (at most k = 3: nothing is dropped by the cap).  The
# value is skewed: u ** 2 / 400, so most values are small (median ~ 25, max 100).  Group g is
# 'a' for u <= 150, 'b' above; 'c' is declared but has no row.
POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e6
delta_per_block = 0.5
max_epsilon_per_query = 1e5

[tables.skew]
privacy_unit = "unit_id"
max_rows_per_unit = 3
contribution = "fixed"  # the quantiles at the limit k = 3 (tests/test_quantile_caps.py: "auto")

[tables.skew.columns]
unit_id = {{ type = "int", private_id = true }}
g       = {{ type = "text", public_values = ["a", "b", "c"] }}
h       = {{ type = "int" }}
v       = {{ type = "float", lower = 0, upper = 100 }}
n       = {{ type = "int", lower = 0, upper = 1000 }}
free    = {{ type = "float" }}

[tables.quant_other]
privacy_unit = "unit_id"
max_rows_per_unit = 3

[tables.quant_other.columns]
unit_id = {{ type = "int", private_id = true }}
w       = {{ type = "float", lower = 0, upper = 10 }}

[analysts.alice]
"""

CREATE = [
    "CREATE TABLE skew AS SELECT CAST(u AS BIGINT) AS unit_id, "
    "CASE WHEN u <= 150 THEN 'a' ELSE 'b' END AS g, CAST(u % 7 AS BIGINT) AS h, "
    "CAST(u * u AS DOUBLE PRECISION) / 400 AS v, CAST(u AS BIGINT) AS n, "
    "CAST(u AS DOUBLE PRECISION) AS free "
    "FROM generate_series(1, 200) AS a(u), generate_series(1, 3) AS b(r) WHERE r <= u % 3 + 1",
    "DROP TABLE IF EXISTS quant_other",
    "CREATE TABLE quant_other AS SELECT CAST(1 AS BIGINT) AS unit_id, "
    "CAST(1 AS DOUBLE PRECISION) AS w",
]


@pytest.fixture
def skew(scratch: Callable[..., Engine]) -> Iterator[Engine]:
    engine = scratch("skew", CREATE, POLICY)
    yield engine
    engine.backend.run_owned(["DROP TABLE IF EXISTS quant_other"])


def _values(engine: Engine, sql: str) -> list[float]:
    return sorted(float(r[0]) for r in engine.backend.run(sql).rows)


def _rank(values: list[float], x: float) -> int:
    return sum(1 for v in values if v < x)


def test_median_is_near_the_true_median(skew: Engine) -> None:
    values = _values(skew, "SELECT v FROM skew")
    n = len(values)
    result = skew.execute("SELECT MEDIAN(v) FROM skew", epsilon=20.0, **ALICE)
    assert result.columns == ("median",)
    (answer,) = result.rows[0]
    (m,) = result.report.measurements
    # Delta = k max(p, 1 - p) = 3 * 0.5; its 95% rank bound, here ~ 3.6 values (+ 1 for ties).
    assert m.sensitivity == 1.5
    assert m.mechanism["name"] == "exponential" and m.mechanism["epsilon"] == 20.0
    bound = m.mechanism["rank_error_95"]
    assert abs(_rank(values, answer) - n / 2) <= 4 * bound + 1
    assert 0 <= answer <= 100


def test_the_report_shows_quantiles_as_the_analyst_wrote_them(skew: Engine) -> None:
    """Each column's source reads as the query did: never the analysis' internal stand-in
    for a quantile (a marked SUM)."""
    report = skew.explain("SELECT MEDIAN(v) + 1 AS m1, MAX(v) AS hi FROM skew", epsilon=1.0,
                          **ALICE)
    sources = {c.name: c.source for c in report.columns}
    assert sources == {"m1": "MEDIAN(v) + 1", "hi": "MAX(v)"}


def test_the_histogram_reads_the_ranked_copy(skew: Engine) -> None:
    """Per-query bounding with a ranked copy (the default): the histogram keeps the light
    units by a plain scan of the copy and ranks the heavy ones in stored order
    (tests/test_quantiles_ranked.py checks the rows it keeps), on every backend."""
    report = skew.explain("SELECT MEDIAN(v) FROM skew WHERE v > 1", epsilon=1.0, **ALICE)
    assert "__ranked_" in report.rewritten_sql and "RANDOM()" not in report.rewritten_sql.upper()
    assert "__chorus_unit_rows <= 3" in report.rewritten_sql


def test_percentiles_share_epsilon_and_one_scan(skew: Engine) -> None:
    values = _values(skew, "SELECT v FROM skew")
    n = len(values)
    sql = ("SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY v) AS p90, "
           "PERCENTILE_DISC(0.25) WITHIN GROUP (ORDER BY v) AS p25, MIN(v) AS lo, "
           "MAX(v) AS hi FROM skew")
    explained = skew.explain(sql, epsilon=40.0, **ALICE)
    result = skew.execute(sql, epsilon=40.0, **ALICE)
    assert result.columns == ("p90", "p25", "lo", "hi")
    # One histogram of v for all four quantiles, drawn jointly (p = 0.01, 0.25, 0.9, 0.99) at
    # the sum of their shares, 4 * 10: Delta = 2k = 6 (mechanisms.joint_quantiles).
    # (One statement per line; on Postgres it counts a ranked copy's branches apart and adds
    # them: three GROUP BYs in the one statement.)
    assert len(result.report.rewritten_sql.splitlines()) == 1
    sens = [m.sensitivity for m in result.report.measurements]
    assert sens == [6.0] * 4
    assert [m.mechanism["epsilon"] for m in result.report.measurements] == [40.0] * 4
    assert [m.mechanism["name"] for m in result.report.measurements] == \
        ["joint_exponential"] * 4
    assert result.report.epsilon == explained.epsilon == 40.0
    for (p, answer), m in zip(zip((0.9, 0.25, 0.01, 0.99), result.rows[0], strict=True),
                              result.report.measurements, strict=True):
        assert abs(_rank(values, answer) - p * n) <= 4 * m.mechanism["rank_error_95"] + 1
    charged = sum(b.epsilon_consumed for b in skew.ledger.blocks())
    assert charged == pytest.approx(40.0)


def test_groups_with_public_values(skew: Engine) -> None:
    result = skew.execute("SELECT g, MEDIAN(v) AS m FROM skew GROUP BY g ORDER BY g",
                          epsilon=20.0, **ALICE)
    assert [r[0] for r in result.rows] == ["a", "b", "c"]  # 'c' has no row: still answered
    for g, m in result.rows:
        truth = _values(skew, f"SELECT v FROM skew WHERE g = '{g}'")
        if truth:
            assert abs(_rank(truth, m) - len(truth) / 2) <= 4 * result.report.measurements[
                0].mechanism["rank_error_95"] + 1
        assert 0 <= m <= 100
    assert result.report.key_release is not None
    assert result.report.key_release.method == "public_values"


def test_integer_column_gives_integers_and_filters_apply(skew: Engine) -> None:
    result = skew.execute("SELECT MEDIAN(n) FROM skew WHERE g = 'b' AND n > 160",
                          epsilon=30.0, **ALICE)
    (answer,) = result.rows[0]
    assert float(answer).is_integer()
    assert 161 <= answer <= 200  # the true median is ~ 181; rank bound ~ 2 values


def test_desc_order_is_the_complement(skew: Engine) -> None:
    result = skew.execute("SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY v DESC) FROM skew",
                          epsilon=20.0, **ALICE)
    assert "0.1-quantile" in result.report.measurements[0].aggregate


def test_duckdb_spellings(backend_url: str, skew: Engine) -> None:
    if not backend_url.startswith("duckdb"):
        pytest.skip("QUANTILE_CONT and QUANTILE are DuckDB's")
    result = skew.execute("SELECT QUANTILE_CONT(v, 0.5), QUANTILE(v, 0.75), "
                          "APPROX_QUANTILE(v, 0.1) FROM skew", epsilon=30.0, **ALICE)
    ps = [m.aggregate.split(" = the ")[1].split("-quantile")[0]
          for m in result.report.measurements]
    assert ps == ["0.5", "0.75", "0.1"]


@pytest.mark.parametrize(("sql", "error", "words"), [
    ("SELECT h + 1, MEDIAN(v) FROM skew GROUP BY h + 1", NotSupportedError,
     ("public_values", "calendar bucket", "COUNT/SUM/AVG grouped by skew.h + 1")),
    ("SELECT h, MEDIAN(v), COUNT(*) FROM skew GROUP BY h", NotSupportedError,
     ("without public_values", "separate queries")),
    # Joined on the unit, S = 3 * 3 is public (answered: tests/test_quantile_joins.py); on
    # another column, S reads private max frequencies.
    ("SELECT MEDIAN(s.v) FROM skew s JOIN quant_other o ON s.h = o.unit_id",
     NotSupportedError, ("join", "private data", "chorus.sensitivity = 'sampled'")),
    # Outputs, HAVING and ORDER BY over the noisy values are answered
    # (tests/test_quantile_mixed.py); what would read anything else is refused.
    ("SELECT g, MEDIAN(v), SUM(COUNT(*)) OVER () FROM skew GROUP BY g", NotSupportedError,
     ("window functions",)),
    ("SELECT g, MEDIAN(v), COUNT(*) FROM skew GROUP BY g HAVING SUM(MAX(v)) > 3",
     NotSupportedError, ("aggregate inside another",)),
    ("SELECT g, MEDIAN(v) FROM skew GROUP BY g HAVING COUNT(*) > (SELECT COUNT(*) FROM skew)",
     NotSupportedError, ("subquery",)),
    ("SELECT g, MEDIAN(v) + h, COUNT(*) FROM skew GROUP BY g", NotSupportedError,
     ("neither a group key nor inside an aggregate", "add h to GROUP BY")),
    ("SELECT g, MEDIAN(v) + RANDOM(), COUNT(*) FROM skew GROUP BY g", QueryRefused,
     ("not allowed",)),
    ("SELECT MEDIAN(DISTINCT v) FROM skew", NotSupportedError, ("DISTINCT",)),
    ("SELECT MEDIAN(free) FROM skew", QueryRefused, ("declared bounds",)),
    ("SELECT PERCENTILE_CONT(1.5) WITHIN GROUP (ORDER BY v) FROM skew", QueryRefused,
     ("outside [0, 1]",)),
    ("SELECT MAX(unit_id) FROM skew", QueryRefused, ("declared bounds",)),
])
def test_refusals_cost_nothing_and_say_what_answers(skew: Engine, sql: str, error: type,
                                                   words: tuple[str, ...]) -> None:
    with pytest.raises(error) as raised:
        skew.execute(sql, epsilon=1.0, **ALICE)
    text = str(raised.value) + " " + (getattr(raised.value, "hint", "") or "")
    for word in words:
        assert word in text
    assert nothing_spent(skew)


def test_sampled_mode_keeps_its_own_queries(skew: Engine) -> None:
    """Opting in to sensitivity sampling picks the sampled kind, not the quantile kind: here
    it refuses (this policy names no sampling distribution), with its own message."""
    with pytest.raises(QueryRefused, match="sampling distribution"):
        skew.execute("SELECT MEDIAN(v) FROM skew", epsilon=5.0, sensitivity="sampled", **ALICE)
    assert nothing_spent(skew)


def test_refused_quantiles_in_validation_name_the_modes() -> None:
    from sqlglot import parse_one

    from analyses.validate import check_node
    with pytest.raises(NotSupportedError) as raised:
        check_node(parse_one("MODE(x)", read="duckdb"))
    assert "MODE" in str(raised.value)
    with pytest.raises(NotSupportedError) as raised:
        check_node(parse_one("MEDIAN(x)", read="duckdb"))
    assert "sampled" in raised.value.hint and "quantile" in raised.value.hint


def test_quantiles_of_one_column_are_not_confused_by_caches(skew: Engine) -> None:
    """MEDIAN(v), MIN(v) and MAX(v) normalise to the same marked SUM(v): the prepared-query and
    answer caches must still tell them apart (they did not: MIN came back as the median)."""
    answers = {}
    for fn in ("MEDIAN", "MIN", "MAX", "MEDIAN"):
        result = skew.execute(f"SELECT {fn}(v) FROM skew", epsilon=30.0, **ALICE)
        (m,) = result.report.measurements
        assert m.aggregate.startswith(fn)
        answers[fn] = result.rows[0][0]
    assert answers["MIN"] < answers["MEDIAN"] < answers["MAX"]


def test_report_columns_name_the_mechanism(skew: Engine) -> None:
    report = skew.explain("SELECT g, MEDIAN(v) AS m, MAX(v) - MIN(v) AS spread FROM skew "
                          "GROUP BY g", epsilon=3.0, **ALICE)
    key, median, spread = report.columns
    assert key.role == "group_key"
    # MEDIAN, MAX and MIN of v drawn jointly at epsilon 3 * 1; Delta = 2k = 6: the
    # mechanism's 2 Delta / epsilon = 4.
    assert median.role == "aggregate" and median.mechanism == "joint_exponential"
    assert median.scale == pytest.approx(4.0)
    assert "rank error" in median.note
    assert spread.role == "derived" and spread.measurements == ("q1", "q2")
    assert report.delta == 0 and report.epsilon == 3.0
    assert nothing_spent(skew)


def test_event_level_table(engine: Engine) -> None:
    """visits has no privacy unit: one row per neighbour, Delta = max(p, 1 - p) alone, and
    2 for the two quantiles of seconds drawn jointly."""
    alone = engine.explain("SELECT MEDIAN(seconds) FROM visits", epsilon=20.0, **ALICE)
    assert [m.sensitivity for m in alone.measurements] == [0.5]
    result = engine.execute("SELECT MEDIAN(seconds), PERCENTILE_DISC(0.2) WITHIN GROUP "
                            "(ORDER BY seconds) FROM visits", epsilon=20.0, **ALICE)
    assert [m.sensitivity for m in result.report.measurements] == [2.0, 2.0]
    # seconds = visit_id % 700 over 1..1000: 1..699 and 0 once, then 1..300 again, so the
    # values up to 300 come twice: rank 500 is at 250, rank 200 at 100 (each value two ranks;
    # the 95% rank bound here is ~ 1.2 ranks, so +-15 is loose).
    median, p20 = result.rows[0]
    assert 235 <= median <= 265 and 85 <= p20 <= 115
    assert "ROW_NUMBER" not in (result.report.rewritten_sql or "")


def test_materialized_bounding_reads_the_stored_sample(scratch: Callable[..., Engine]) -> None:
    engine = scratch("skew", CREATE, POLICY.replace(
        'contribution = "fixed"', 'bounding = "materialized"', 1))
    result = engine.execute("SELECT MEDIAN(v) FROM skew", epsilon=20.0, **ALICE)
    assert "chorus_private" in (result.report.rewritten_sql or "")
    assert 0 <= result.rows[0][0] <= 100
    engine.backend.run_owned(["DROP TABLE IF EXISTS quant_other"])


def test_a_quantile_asked_twice_is_one_release(skew: Engine) -> None:
    """MEDIAN(v) in SELECT, HAVING and ORDER BY (and spelled PERCENTILE_CONT(0.5)) is one draw
    and one charge: the HAVING filters the very values shown (it filtered an independent draw)."""
    sql = ("SELECT g, MEDIAN(v) AS m, PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY v) AS m2 "
           "FROM skew GROUP BY g HAVING MEDIAN(v) > 30 ORDER BY MEDIAN(v)")
    for _ in range(5):
        result = skew.execute(sql, epsilon=0.05, **ALICE)  # noisy: independent draws differ
        (m,) = result.report.measurements
        assert m.mechanism["epsilon"] == 0.05
        assert all(row[1] > 30 and row[1] == row[2] for row in result.rows)
        assert [row[1] for row in result.rows] == sorted(row[1] for row in result.rows)



# -- quantiles next to COUNT/SUM/AVG-like aggregates (chorus_py.kinds.mixed) --------------------
def test_min_max_avg_split_epsilon_by_measurements(skew: Engine) -> None:
    """MIN, MAX (two quantiles) and AVG (two measurements: a centred SUM and a COUNT) at
    epsilon 40: 2 / 4 of it to the quantiles, 2 / 4 to the AVG, one claim of 40."""
    values = _values(skew, "SELECT v FROM skew")
    n = len(values)
    sql = "SELECT MIN(v), MAX(v), AVG(v) FROM skew"
    explained = skew.explain(sql, epsilon=40.0, **ALICE)
    assert "2/4 = 20" in explained.notes[0] and "delta 0" in explained.notes[0]
    result = skew.execute(sql, epsilon=40.0, **ALICE)
    assert result.columns == ("min", "max", "avg")
    assert result.types == ("float", "float", "float")
    q0, q1, m0, m1 = result.report.measurements
    # MIN and MAX of v are drawn jointly at eps_q = 40 * 2 / 4 = 20, Delta = 2k = 6.
    assert (q0.mechanism["epsilon"], q0.sensitivity) == (20.0, 6.0)
    assert q1.mechanism is q0.mechanism or q1.mechanism == q0.mechanism
    # AVG: SUM(v - 50) with Delta = k * 50 = 150 and COUNT with Delta = k = 3, planned at
    # eps_a = 20 exactly as the same AVG asked alone at 20.
    assert (m0.sensitivity, m1.sensitivity) == (150.0, 3.0)
    alone = skew.explain("SELECT AVG(v) FROM skew", epsilon=20.0, **ALICE).measurements
    assert [m.mechanism for m in (m0, m1)] == [m.mechanism for m in alone]
    assert result.report.epsilon == explained.epsilon == 40.0
    (claim,) = skew.ledger.claims()  # one claim for the whole query
    assert claim.epsilon == pytest.approx(40.0)
    assert sum(b.epsilon_consumed for b in skew.ledger.blocks()) == pytest.approx(40.0)
    lo, hi, avg = result.rows[0]
    assert abs(_rank(values, lo) - 0.01 * n) <= 4 * q0.mechanism["rank_error_95"] + 1
    assert abs(_rank(values, hi) - 0.99 * n) <= 4 * q1.mechanism["rank_error_95"] + 1
    assert avg == pytest.approx(sum(values) / n, abs=2.0)
    bars = result.error_bars.intervals()[0]
    assert "rank within" in bars[0].reason and bars[2].lower <= avg <= bars[2].upper


def test_grouped_median_and_count_in_the_analysts_order(skew: Engine) -> None:
    """Public keys: every declared group (c has no row), the parts matched on the key, the
    analyst's column order, ORDER BY and LIMIT over the merged rows."""
    sql = ("SELECT COUNT(*) AS n, g, MEDIAN(v) AS med FROM skew GROUP BY 2 "
           "ORDER BY g DESC LIMIT 2")
    result = skew.execute(sql, epsilon=20.0, **ALICE)
    assert result.columns == ("n", "g", "med")
    assert result.types == ("integer", "text", "float")
    assert [r[1] for r in result.rows] == ["c", "b"]
    q0, m0 = result.report.measurements
    # One quantile, one count: 10 each; the median's Delta = k max(p, 1 - p) = 1.5, the
    # count's k = 3.
    assert (q0.sensitivity, q0.mechanism["epsilon"]) == (1.5, 10.0)
    assert m0.sensitivity == 3.0 and m0.mechanism["epsilon"] == 10.0
    assert [c.role for c in result.report.columns] == ["aggregate", "group_key", "aggregate"]
    truth = _values(skew, "SELECT v FROM skew WHERE g = 'b'")
    n, _, med = next(r for r in result.rows if r[1] == "b")
    assert abs(n - len(truth)) <= 3 * (math.log(2e9) + 1) / 10 + 1
    assert abs(_rank(truth, med) - len(truth) / 2) <= 4 * q0.mechanism["rank_error_95"] + 1
    assert result.rows[0][0] is not None  # 'c': no row, a noisy count of 0 all the same


def test_mixed_query_with_a_calendar_key(scratch: Callable[..., Engine]) -> None:
    """Calendar keys of the block column are public keys: both parts list the same months."""
    policy = POLICY.replace('[tables.skew]\n', '[tables.skew]\nblock = {{ column = "t", '
                            'size = "1 day", start = "2026-01-01", end = "2026-03-01" }}\n'
                            ).replace('free    = {{ type = "float" }}',
                                      'free    = {{ type = "float" }}\n'
                                      't       = {{ type = "timestamp" }}')
    create = [CREATE[0].replace(" AS free ", " AS free, TIMESTAMP '2026-01-01' + "
                                "(u % 50) * INTERVAL '1 day' AS t "), *CREATE[1:]]
    engine = scratch("skew", create, policy)
    try:
        result = engine.execute("SELECT DATE_TRUNC('month', t) AS m, MEDIAN(v), SUM(v) "
                                "FROM skew GROUP BY 1 ORDER BY 1", epsilon=20.0, **ALICE)
    finally:
        engine.backend.run_owned(["DROP TABLE IF EXISTS quant_other"])
    assert [r[0].month for r in result.rows] == [1, 2]
    assert all(r[1] is not None and r[2] is not None for r in result.rows)
    assert result.types == ("timestamp", "float", "float")


# -- quantiles grouped by a column without public values: keys released by a threshold --------
def test_quantiles_grouped_by_a_thresholded_key(skew: Engine) -> None:
    """h = u % 7 has no public values: each group's noisy row count must clear tau.  Hand
    derivation at epsilon 20, delta 1e-6, k = 3, D = min(g, k) = 3: the gate gets 0.2 * 20 = 4,
    b = k / 4 = 0.75, tau = k + b ln(D / delta) = 3 + 0.75 ln(3e6) = 14.1905...; the median
    gets 16, Delta = k max(p, 1 - p) = 1.5.  Every h holds ~57 rows: all 7 are released."""
    sql = "SELECT h, MEDIAN(v) AS med FROM skew GROUP BY h ORDER BY h"
    result = skew.execute(sql, epsilon=20.0, delta=1e-6, **ALICE)
    q0, t0 = result.report.measurements
    assert (q0.sensitivity, q0.mechanism["epsilon"]) == (1.5, 16.0)
    assert (t0.sensitivity, t0.mechanism["epsilon"]) == (3.0, 4.0)
    assert t0.mechanism["scale"] == pytest.approx(0.75)
    release = result.report.key_release
    assert release is not None and release.method == "threshold"
    assert release.threshold == pytest.approx(3 + 0.75 * math.log(3e6))
    assert release.delta == 1e-6 and result.report.delta == 1e-6
    assert [r[0] for r in result.rows] == list(range(7))
    assert result.types == ("integer", "float")
    for h, med in result.rows:
        truth = _values(skew, f"SELECT v FROM skew WHERE h = {h}")
        assert abs(_rank(truth, med) - len(truth) / 2) <= 4 * q0.mechanism["rank_error_95"] + 1
    (claim,) = skew.ledger.claims()
    assert (claim.epsilon, claim.delta) == (pytest.approx(20.0), pytest.approx(1e-6))


def test_a_thresholded_key_hides_small_groups(skew: Engine) -> None:
    """At epsilon 1 (gate 0.2: b = 15, tau = 3 + 15 ln(3e6) ~ 226.8) no group of ~57 rows can
    clear tau: the answer is empty, says why, and is charged (the histogram read the data)."""
    result = skew.execute("SELECT h, MAX(v) FROM skew GROUP BY h", epsilon=1.0, delta=1e-6,
                          **ALICE)
    assert result.rows == [] and "tau" in result.report.warnings[0]
    assert result.report.key_release.threshold == pytest.approx(3 + 15 * math.log(3e6))
    assert sum(b.epsilon_consumed for b in skew.ledger.blocks()) == pytest.approx(1.0)


def test_a_thresholded_key_needs_delta(skew: Engine) -> None:
    with pytest.raises(InvalidParameter, match="delta > 0"):
        skew.execute("SELECT h, MEDIAN(v) FROM skew GROUP BY h", epsilon=1.0, delta=0.0,
                     **ALICE)
    assert nothing_spent(skew)


@pytest.mark.parametrize("dialect", ["duckdb", "postgres", "spark"])
def test_every_quantile_function_passes_the_routings_word_filter(dialect: str) -> None:
    """The routing skips its parse for a text holding none of the words of
    ``analyses.quantiles.may_ask_quantiles``: every function name sqlglot reads as a quantile,
    MEDIAN, MIN or MAX (is_quantile), in any of its argument forms, holds one of them."""
    parser = dialect_named(dialect).parser_class
    names = {*parser.FUNCTIONS, *parser.FUNCTION_PARSERS}
    forms = ("SELECT {}(x) FROM t", "SELECT {}(x, 0.5) FROM t", "SELECT {}(0.5, x) FROM t",
             "SELECT {}(0.5) WITHIN GROUP (ORDER BY x) FROM t")
    found = set()
    for name in names:
        for form in forms:
            try:
                tree = sqlglot.parse_one(form.format(name), read=dialect)
            except (sqlglot.errors.ParseError, sqlglot.errors.TokenError, ValueError,
                    TypeError, IndexError, KeyError, AttributeError):
                continue
            if any(is_quantile(node) for node in tree.walk()):
                found.add(name)
                assert may_ask_quantiles(form.format(name)), (name, form)
    # The search does find them: the filter is tested on the names that matter.
    assert {"MIN", "MAX", "PERCENTILE_CONT"} <= found


def test_the_word_filter_turns_away_only_texts_without_quantiles() -> None:
    """A text the filter turns away holds no quantile (the corpus' and held-out questions)."""
    from benchmarks.corpus import CORPUS, HELDOUT

    for query in (*CORPUS, *HELDOUT):
        if not may_ask_quantiles(query.sql):
            tree = sqlglot.parse_one(query.sql, read="postgres")
            assert not any(is_quantile(node) for node in tree.walk()), query.sql
