"""Joins with elastic sensitivity on Spark (tests/test_joins_engine.py): the join keys' max
frequencies read from the data by Spark (``stores.frequencies``), the smooth bound and the
noise near the truth, blocks charged on every table read, refusals free, ranked copies read."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from chorus_py.engine import Engine
from tests.test_joins_engine import (  # noqa: F401  (collected here with the Spark fixtures)
    POLICY,
    SETUP,
    TABLES,
    test_blocks_of_every_table_charged,
    test_count_and_sum_near_truth,
    test_delta_required_and_refusals_free,
    # Rides (a unit, per-query bounding) read through their ranked copy: after a semi-join
    # (light UNION ALL heavy) and whole (stored ranks), joined with riders.
    test_sum_avg_grouped_join_to_public,
)


@pytest.fixture
def joins(scratch: Callable[..., Engine]) -> Iterator[Callable[..., Engine]]:
    """Engines over the join tables as Parquet (DuckDB SQL writes them: its spellings of the
    module's fixture), noise by the proxy (Spark's only mode)."""
    setup = [*(f"DROP TABLE IF EXISTS {t}" for t in TABLES)] + [
        s.replace("DOUBLE PRECISION", "DOUBLE")
             .replace("(i % 3) * INTERVAL '1 day'", "to_days(CAST(i % 3 AS INTEGER))")
        for s in SETUP]

    def make(noise: str = "proxy") -> Engine:
        return scratch("j_orders", setup, POLICY.replace("{noise}", "proxy"))

    make.admin = make().backend  # type: ignore[attr-defined]  (the module's _truth reads it)
    yield make
