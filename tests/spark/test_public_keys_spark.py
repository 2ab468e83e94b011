"""Public keys the query does not list, on Spark (tests/test_public_keys.py): calendar buckets
of the block column (Spark computes DATE_TRUNC and EXTRACT like the other engines: the grid
the proxy lists must match the keys Spark's rows carry), keys spelled out as CASE literals, and
quantiles per bucket."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from chorus_py.engine import Engine
from tests.test_public_keys import (  # noqa: F401  (collected here with the Spark fixtures)
    POLICY,
    SETUP,
    K,
    test_a_case_of_literals_returns_every_band_without_a_threshold,
    test_a_monthly_series_at_small_epsilon_returns_every_month,
    test_an_hour_of_day_series_returns_all_24_hours,
    test_quantiles_per_calendar_bucket_return_every_bucket,
)


@pytest.fixture
def rides(scratch: Callable[..., Engine]) -> Iterator[Engine]:
    """The module's tables as Parquet, noise by the proxy (Spark's only mode)."""
    yield scratch("pk_rides", SETUP, POLICY % ("proxy", K))
