"""What is particular to Spark: per-person row selection by a keyed hash that a retried or
repartitioned task cannot change, the noise drawn by the proxy with the right distribution,
materialized bounding in the private directory, the policy's Spark settings, and the demo's
queries answered like on DuckDB."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from chorus_py.backends.spark import SESSION_SCHEMA
from chorus_py.engine import Engine
from chorus_py.errors import PolicyError
from chorus_py.policy import load_policy, parse_policy
from mechanisms.discrete_laplace import DiscreteLaplace
from mechanisms.intervals import Interval
from rewriters.contribution import sample_table
from rewriters.dialect import dialect
from tests.conftest import tolerance

ALICE = {"analyst": "alice"}


def _kept(engine: Engine, key: int, partitions: int) -> set[tuple[object, ...]]:
    """The (rider, trip) rows contribution bounding keeps (k = 2) for one key, with the trips
    split into ``partitions`` partitions and shuffled over as many."""
    session = engine.backend._session  # type: ignore[attr-defined]
    session.conf.set("spark.sql.shuffle.partitions", str(partitions))
    session.table("trips").repartition(partitions).createOrReplaceTempView("trips_split")
    sql = dialect(sample_table("trips_split", "rider_id", 2), "spark").sql("spark")
    rows = session.sql(f"SELECT rider_id, trip_id FROM ({sql}) AS s",
                       args={"chorus_key": key}).collect()
    session.catalog.dropTempView("trips_split")
    return {tuple(r) for r in rows}


def test_a_retried_or_repartitioned_task_keeps_the_same_rows(engine: Engine) -> None:
    """The rank of a row is a keyed hash of the row: the same key keeps the same rows however
    Spark splits the work (a retried task recomputes its partition, possibly elsewhere), while
    rand() would draw again.  Another key keeps other rows (the ranking is not fixed)."""
    one = _kept(engine, 12345, 1)
    assert one == _kept(engine, 12345, 7) == _kept(engine, 12345, 3)
    (riders,) = engine.backend.run("SELECT COUNT(*) FROM (SELECT rider_id FROM trips GROUP BY "
                                   "rider_id HAVING COUNT(*) > 2) AS r").rows[0]
    assert riders > 0 and _kept(engine, 54321, 3) != one
    per_rider: dict[object, int] = {}
    for rider, _ in one:
        per_rider[rider] = per_rider.get(rider, 0) + 1
    assert max(per_rider.values()) == 2


def test_no_rand_reaches_spark_and_each_statement_has_a_fresh_key(engine: Engine) -> None:
    """The answer ranks rows by the keyed hash, or reads the stored ranked copy (whose ranks
    were drawn once, by the keyed hash, when it was built): never rand()."""
    report = engine.explain("SELECT COUNT(*) FROM trips", epsilon=1.0, **ALICE)
    sql = report.rewritten_sql or ""
    assert not re.search(r"\bRAND(OM|N)?\s*\(", sql, re.IGNORECASE)
    if "__ranked_" in sql:  # per-query bounding over the ranked copy (ranked_copy = true)
        assert "chorus_private.`trips__ranked_" in sql
    else:
        assert "XXHASH64(:chorus_key" in sql and f"`{SESSION_SCHEMA}`.trips" in sql
    # The key is bound per statement, never written into the SQL text.
    assert not re.search(r"XXHASH64\(\d", sql)
    rendered = dialect(sample_table("trips", "rider_id", 3), "spark").sql("spark")
    assert "XXHASH64(:chorus_key, t.*)" in rendered
    assert not re.search(r"\bRAND(OM|N)?\s*\(", rendered, re.IGNORECASE)


def test_count_noise_has_its_distribution(make_engine: Callable[..., Engine],
                                          backend_url: str) -> None:
    """Proxy noise on Spark: COUNT(*) of the event-level visits (1000 rows, sensitivity 1) is
    1000 + discrete Laplace of scale 1/epsilon; the draws are compared with the mechanism's own
    sampler (two-sample Kolmogorov-Smirnov; a false failure has probability 1e-4)."""
    engine = make_engine(backend_url, epsilon_per_block=1e6, max_epsilon=10.0)
    epsilon = 0.5
    draws = []
    for _ in range(40):
        result = engine.execute("SELECT COUNT(*) FROM visits", epsilon=epsilon, **ALICE)
        assert result.report.columns[0].scale == pytest.approx(1 / epsilon)
        draws.append(result.rows[0][0] - 1000)
    reference = DiscreteLaplace.from_sensitivity(1.0, epsilon).sample(np.zeros(20000))
    assert stats.ks_2samp(draws, reference).pvalue > 1e-4
    assert len(set(draws)) > 5


def test_materialized_sample_lives_in_the_private_directory(scratch: Callable[..., Engine],
                                                           spark_data: Path) -> None:
    from tests.test_engine import RIDES_POLICY

    engine = scratch("rides", ["CREATE TABLE rides AS SELECT rider_id, pickup_time, fare "
                               "FROM trips"], RIDES_POLICY.replace("{k}", "3"))
    result = engine.execute("SELECT COUNT(*) FROM rides", epsilon=1000.0)
    sql = result.report.rewritten_sql or ""
    assert "chorus_private" in sql and "ROW_NUMBER" not in sql
    (name,) = [t for t in engine.backend.owned_tables() if t.startswith("rides__bounded_")]
    assert (spark_data / "private" / "chorus_private.db" / name).is_dir()
    (worst,) = engine.backend.run(f"SELECT MAX(c) FROM (SELECT COUNT(*) AS c FROM "
                                  f"chorus_private.`{name}` GROUP BY rider_id) AS s").rows[0]
    assert worst <= 3
    (expected,) = engine.backend.run("SELECT SUM(LEAST(c, 3)) FROM (SELECT COUNT(*) AS c FROM "
                                     "rides GROUP BY rider_id) AS s").rows[0]
    assert abs(result.rows[0][0] - expected) <= tolerance(result.report.columns[0])


def _policy(url: str, privacy: str = "", spark: str = 'tables = { t = "t.parquet" }') -> dict:
    import tomllib

    return tomllib.loads(f'[backend]\nurl = "{url}"\n[backend.spark]\n{spark}\n'
                         f"[privacy]\nepsilon_per_block = 1.0\n{privacy}\n[tables]\n")


def test_spark_policy_defaults_to_proxy_noise_and_refuses_sql_noise() -> None:
    assert parse_policy(_policy("spark://local")).privacy.noise == "proxy"
    with pytest.raises(PolicyError, match="not available on Spark"):
        parse_policy(_policy("spark://local", 'noise = "sql"'))


@pytest.mark.parametrize(("url", "spark", "message"), [
    ("sc://cluster:15002", 'tables = { t = "/lake/t" }', "private_dir"),
    ("sc://cluster:15002", 'tables = { t = "t.parquet" }\nprivate_dir = "/p"', "absolute"),
    ("sc://cluster:15002", 'tables = { t = "/t" }\nprivate_dir = "p"', "absolute"),
    ("sc://cluster:15002", 'warehouse = "/lake"\nprivate_dir = "/p"', "name every table"),
    ("sc://cluster:15002", 'tables = { t = "/t" }\nprivate_dir = "/p"\ncores = 2', "cores"),
    ("sc://", 'tables = { t = "/t" }\nprivate_dir = "/p"', "sc://host:port"),
    ("spark://cluster:7077", 'tables = { t = "t.parquet" }', "spark://local"),
    ("spark://local", 'cores = 2', "name the tables"),
    ("duckdb:///x.duckdb", 'tables = { t = "t.parquet" }', "is for url"),
])
def test_bad_spark_policies_are_refused(url: str, spark: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policy(_policy(url, spark=spark))


def test_demo_queries_on_spark_match_duckdb(duckdb_data: str, spark_data: Path,
                                            tmp_path: Path) -> None:
    """``chorus demo --parquet``'s policy: the demo queries (joins included) answered on Spark
    agree with DuckDB within their noise."""
    demo_queries_match_duckdb(duckdb_data, tmp_path, lambda text: text.replace(
        'private_dir = "spark-private"', f'private_dir = "{spark_data / "private"}"'))


def demo_queries_match_duckdb(duckdb_data: str, tmp_path: Path,
                              adapt: Callable[[str], str]) -> None:
    """The demo queries on ``chorus demo --parquet``'s Spark policy, ``adapt``-ed (its text
    in, the text to use out), and on the DuckDB demo policy: the same answers within noise."""
    from chorus_py.cli import _DEMO_QUERIES
    from chorus_py.demo.parquet import export_parquet
    from chorus_py.demo.people import JOIN_QUERIES

    source = Path(duckdb_data.removeprefix("duckdb:///")).parent
    for name in ("demo.duckdb", "policy.toml"):
        shutil.copy(source / name, tmp_path / name)
    for name in ("policy.toml",):  # a budget wide enough for every demo query at eps 50
        (tmp_path / name).write_text((tmp_path / name).read_text()
                                     .replace("epsilon_per_block = 10.0", "epsilon_per_block = 1e6")
                                     .replace("max_epsilon_per_query = 2.0",
                                              "max_epsilon_per_query = 1e5"))
    policy = export_parquet(tmp_path)
    policy.write_text(adapt(policy.read_text()))
    spark, duck = Engine(load_policy(policy)), Engine(load_policy(tmp_path / "policy.toml"))
    try:
        for _, sql in [*_DEMO_QUERIES, *JOIN_QUERIES]:
            a = spark.execute(sql, epsilon=50.0, delta=1e-7)
            b = duck.execute(sql, epsilon=50.0, delta=1e-7)
            assert a.columns == b.columns and a.types == b.types, sql
            numeric = [i for i, c in enumerate(a.report.columns)
                       if c.role in ("aggregate", "derived")]
            right = {_key(r, numeric): (r, iv) for r, iv in zip(b.rows, b.intervals(),
                                                                  strict=True)}
            matched = 0
            for row, row_iv in zip(a.rows, a.intervals(), strict=True):
                found = right.get(_key(row, numeric))
                if found is None:
                    continue
                other, other_iv = found
                matched += 1
                for i in numeric:
                    x, y = row[i], other[i]
                    if x is None or y is None:
                        continue
                    col_a, col_b = a.report.columns[i], b.report.columns[i]
                    if col_a.scale is not None and col_b.scale is not None:
                        # Each engine chose its own cap at eps 50 (nearly the same): the two
                        # answers differ by their noise and a few percent of bias at most.
                        slack = tolerance(col_a) + tolerance(col_b) + 0.1 * abs(y)
                    else:
                        # Derived (AVG, STDDEV) over automatic clipping bounds, each engine
                        # its own: 30% or three times their 95% half-widths added (a 20%
                        # miss was seen for an STDDEV of a few hundred trips).
                        widths = [(iv.upper - iv.lower) / 2 for iv in (row_iv[i], other_iv[i])
                                  if isinstance(iv, Interval) and iv.bounded]
                        slack = max([0.3 * abs(y)] + ([3 * sum(widths)] if len(widths) == 2
                                                      else []))
                    assert abs(x - y) <= slack + 1e-9, (sql, row, other)
            # (A top-3 of noisy counts may pick other keys on each engine: none matched.)
            assert matched or "LIMIT" in sql, sql
    finally:
        spark.close()
        duck.close()


def _key(row: tuple[object, ...], numeric: list[int]) -> tuple[object, ...]:
    return tuple(v for i, v in enumerate(row) if i not in numeric)
