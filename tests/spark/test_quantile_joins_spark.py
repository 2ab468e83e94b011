"""Quantiles over publicly bounded joins on Spark (tests/test_quantile_joins.py): the same
functions, on Parquet copies of their tables, with this package's fixtures."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from chorus_py.engine import Engine
from tests.test_quantile_joins import (  # noqa: F401  (collected here with the Spark fixtures)
    POLICY,
    SETUP,
    test_a_join_keeps_s_with_automatic_caps,
    test_join_with_a_public_table_on_a_key,
    test_median_over_a_join_on_the_unit,
    test_next_to_other_aggregates_with_having,
    test_the_join_histogram_reads_the_ranked_copies,
)


@pytest.fixture
def rides(scratch: Callable[..., Engine]) -> Iterator[Engine]:
    """The module's tables as Parquet (the fixture there drops them from a DuckDB or Postgres
    database afterwards; here they are files of the test's own directory)."""
    yield scratch("qj_rides", SETUP, POLICY)


@pytest.fixture
def auto_rides(scratch: Callable[..., Engine]) -> Iterator[Engine]:
    yield scratch("qj_rides", SETUP,
                  POLICY.replace('contribution = "fixed"', 'contribution = "auto"'))
