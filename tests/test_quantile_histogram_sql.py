"""The quantile histogram's per-cell key index and its bin (``rewriters.quantiles``, issue 23).

The statement groups its rows by the keys' values and maps a declared value to its index once
per cell (``_indexed``), and bins the value with ``LEAST`` without DuckDB's per-row NULL test.
It must give exactly the cells that indexing and binning every row gave: checked here against
the histogram computed by hand, row by row (the old statement's CASE per row), on data with
NULL values and NULL keys, undeclared key values, ties, values at and beyond the bounds, the
infinities and NaN, on both backends, through the ranked copy (its branches in one count or
apart; the bin stored in the copy, ``rewriters.bins``) and through per-query bounding.  The
cap (40) binds no unit: every counted row is in.
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from chorus_py.engine import Engine
from chorus_py.kinds import quantile as quantile_kind
from chorus_py.kinds.quantile import BINS, QuantileDetail
from tests.conftest import table_with_rows

UPPER = 100.0

POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1000.0
max_epsilon_per_query = 500.0
noise = "proxy"

[tables.{table}]
privacy_unit = "person"
max_rows_per_unit = 40
contribution = "fixed"
ranked_copy = {ranked}

[tables.{table}.columns]
person = {{ type = "int" }}
g = {{ type = "text", public_values = ["a", "b"] }}
c = {{ type = "int", public_values = [1, 2, 3] }}
v = {{ type = "float", lower = 0, upper = {upper} }}

[analysts.alice]
"""

#: Values: below, at and above the bounds, ties (50 many times), bins' edges (0.01 is the
#: first edge: 0.01 * 100 = 1.0), the last bin, the infinities, NaN, a huge finite value
#: and NULL.
VALUES = [-5.0, 0.0, 0.0, 0.005, 0.01, 33.33, 50.0, 50.0, 50.0, 50.0, 99.995, 99.9999, 100.0,
          150.0, 1e308, math.inf, -math.inf, math.nan, None, 12.5]
Row = tuple[int, str | None, int | None, float | None]


def _rows() -> list[Row]:
    """(person, g, c, v): every value under every combination of a declared key value, an
    undeclared one ('z', 4) and NULL; 7 units of up to 40 rows (the cap binds none)."""
    out: list[Row] = []
    keys = [(g, c) for g in ("a", "b", "z", None) for c in (1, 2, 3, 4, None)]
    for i, (g, c) in enumerate(keys):
        for j, v in enumerate(VALUES):
            if (i + j) % 3:  # not every value in every group: groups differ
                out.append(((i * len(VALUES) + j) % 7, g, c, v))
    return out


def _bin(v: float) -> int:
    """The bin of v as the per-row CASE computed it: v <= 0 first, v >= upper (NaN is above
    every number on both databases) last, else FLOOR((v - 0) * 100.0), at most BINS - 1."""
    if v <= 0:
        return 0
    if math.isnan(v) or v >= UPPER:
        return BINS - 1
    return min(math.floor((v - 0) * (BINS / UPPER)), BINS - 1)


def _expected(keys: tuple[str, ...]) -> dict[tuple[object, ...], int]:
    """(key indexes..., bin) -> rows, row by row: a row counts when its value is not NULL and
    its keys are declared values."""
    declared = {"g": ("a", "b"), "c": (1, 2, 3)}
    out: dict[tuple[object, ...], int] = collections.Counter()
    for _, g, c, v in _rows():
        values = {"g": g, "c": c}
        if v is None or any(values[k] not in declared[k] for k in keys):
            continue
        out[(*(declared[k].index(values[k]) for k in keys), _bin(v))] += 1
    return dict(out)


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    columns = "person BIGINT, g TEXT, c BIGINT, v DOUBLE PRECISION"
    with table_with_rows(request, tmp_path, "qcells", columns, _rows()) as made:
        yield made


QUERIES = [
    ("SELECT MIN(v), MAX(v) FROM {t}", ()),
    ("SELECT g, MEDIAN(v) FROM {t} GROUP BY g", ("g",)),
    ("SELECT g, c, PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY v) FROM {t} GROUP BY g, c",
     ("g", "c")),
]


@pytest.mark.parametrize("reading", ["ranked", "ranked-split", "per-query"])
@pytest.mark.parametrize("query, keys", QUERIES, ids=["no-key", "one-key", "two-keys"])
def test_the_cells_are_those_of_indexing_and_binning_every_row(
        table: tuple[str, str], policy_engine: Callable[[str], Engine],
        monkeypatch: pytest.MonkeyPatch, query: str, keys: tuple[str, ...],
        reading: str) -> None:
    monkeypatch.setattr(quantile_kind, "SPLIT_DIALECTS", frozenset(
        {"duckdb", "postgres"} if reading == "ranked-split" else ()))
    url, name = table
    engine = policy_engine(POLICY.format(url=url, table=name, upper=UPPER,
                                         ranked="false" if reading == "per-query" else "true"))
    engine.warm_up(wait=True)
    _, prepared = engine.prepare(query.format(t=name), "alice", epsilon=1.0)
    detail = prepared.detail
    assert isinstance(detail, QuantileDetail)
    ((_, statement),) = detail.histograms
    assert ("__ranked_" in statement) == (reading != "per-query")
    assert ("chorus_parts" in statement) == (reading == "ranked-split")
    # Over the copy the bin is its stored one (rewriters.bins), computed per row otherwise.
    assert ("__chorus_bin0" in statement) == (reading != "per-query")
    assert ("FLOOR" in statement) == (reading == "per-query")
    # The heavy units' rows from the copy's twin (kinds.quantile._histogram), split or not.
    assert (re.search(r'__ranked_[0-9a-f]+_u"? AS', statement) is not None) == (
        reading != "per-query")
    assert "IS NULL OR" not in statement  # no NULL test around LEAST per row
    rows = engine.backend.run(statement).rows
    # One row per (group, bin): the per-cell index adds up the cells of one group.
    assert len({tuple(r[:-1]) for r in rows}) == len(rows)
    expected = _expected(keys)
    assert {tuple(r[:-1]): int(r[-1]) for r in rows} == expected
    # The cells the kind reads (column-wise, keys by index): the same counts per group.
    groups = detail.groups if keys else ((),)
    cells = quantile_kind._index_cells(engine.backend.run_integers(statement), detail.lookup,
                                       len(groups))
    dense = np.zeros((len(groups), BINS))
    declared = {"g": ("a", "b"), "c": (1, 2, 3)}
    for (*indexes, b), n in expected.items():
        values = tuple(declared[k][i] for k, i in zip(keys, indexes, strict=True))
        dense[groups.index(values) if keys else 0, b] += n
    assert np.array_equal(cells, dense)
