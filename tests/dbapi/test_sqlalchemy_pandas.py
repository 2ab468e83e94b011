"""The SQLAlchemy dialect, found by its entry point, and pandas.read_sql over it."""

from __future__ import annotations

import datetime as dt
from importlib.metadata import entry_points
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy as sa

from chorus_py.errors import QueryRefused
from tests.rest.harness import ALICE_TOKEN, ServerThread


def test_dialects_are_registered_by_entry_point() -> None:
    names = {ep.name: ep.value for ep in entry_points(group="sqlalchemy.dialects")}
    assert names["chorus"] == "chorus_py.clients.sqlalchemy_dialect:ChorusDialect"
    assert names["chorus.http"] == "chorus_py.clients.sqlalchemy_dialect:ChorusHTTPDialect"
    assert names["chorus.https"] == "chorus_py.clients.sqlalchemy_dialect:ChorusHTTPSDialect"


@pytest.fixture(params=["local", "remote"])
def engine(request: pytest.FixtureRequest, duckdb_policy: Path) -> sa.Engine:
    if request.param == "local":
        # four slashes: an absolute path (the SQLAlchemy convention)
        url = f"chorus:///{duckdb_policy}?analyst=alice&epsilon=0.5"
    else:
        server: ServerThread = request.getfixturevalue("remote")
        url = (f"chorus+http://{server.url.removeprefix('http://')}/"
               f"?token={ALICE_TOKEN}&epsilon=0.5")
    created = sa.create_engine(url)
    yield created
    created.dispose()


def test_pandas_read_sql(engine: sa.Engine) -> None:
    frame = pd.read_sql("SELECT city, COUNT(*) AS trips, AVG(fare) AS avg_fare FROM trips "
                        "GROUP BY city ORDER BY city", engine)
    assert list(frame.columns) == ["city", "trips", "avg_fare"]
    assert list(frame["city"]) == sorted(["SF", "NYC", "LA", "CHI", "SEA"])
    assert frame["trips"].dtype.kind == "i" and frame["avg_fare"].dtype.kind == "f"
    exact = pd.read_sql(sa.text("SELECT state, COUNT(*) AS n FROM cities WHERE state <> :s "
                                "GROUP BY state ORDER BY state"), engine, params={"s": "NY"})
    assert exact.to_dict("records") == [{"state": "CA", "n": 2}, {"state": "IL", "n": 1},
                                        {"state": "WA", "n": 1}]


def test_core_select_and_reflection(engine: sa.Engine) -> None:
    inspector = sa.inspect(engine)
    assert inspector.get_table_names() == ["cities", "trips", "visits"]
    columns = {c["name"]: c["type"] for c in inspector.get_columns("trips")}
    assert isinstance(columns["fare"], sa.Float)
    assert isinstance(columns["pickup_time"], sa.TIMESTAMP)
    trips = sa.Table("trips", sa.MetaData(), autoload_with=engine)
    query = (sa.select(trips.c.city, sa.func.count().label("n"))
             .where(trips.c.pickup_time >= dt.datetime(2026, 3, 31))
             .group_by(trips.c.city).order_by(trips.c.city))
    with engine.connect() as conn:
        rows = conn.execute(query).all()
        assert [r.city for r in rows] == sorted(["SF", "NYC", "LA", "CHI", "SEA"])
        assert conn.connection.dbapi_connection.analyst == "alice"  # the DB-API connection
        assert conn.execute(sa.text("SELECT COUNT(*) FROM cities")).scalar() == 5
        with pytest.raises(sa.exc.ProgrammingError) as err:
            conn.execute(sa.text("SELECT * FROM trips"))
        assert isinstance(err.value.orig, QueryRefused)
        conn.commit()
        conn.rollback()


def test_bad_urls() -> None:
    with pytest.raises(sa.exc.ArgumentError):
        sa.create_engine("chorus:///policy.toml?analyst=alice&colour=blue").connect()
    with pytest.raises(sa.exc.ArgumentError):
        sa.create_engine("chorus:///policy.toml?epsilon=lots").connect()
    with pytest.raises(sa.exc.ArgumentError):
        sa.create_engine("chorus://").connect()
    with pytest.raises(sa.exc.ArgumentError):
        sa.create_engine("chorus+http:///?token=x").connect()
