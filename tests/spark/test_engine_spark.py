"""The engine's end-to-end tests (tests/test_engine.py) on Spark: the same functions, run with
this package's fixtures (``backend_url`` is the local Spark, noise is added by the proxy)."""

from tests.test_engine import (  # noqa: F401  (collected here with the Spark fixtures)
    test_answers_are_noisy,
    test_arithmetic_on_aggregates,
    test_budget_is_charged_on_the_blocks_read,
    test_contribution_bound_keeps_k_rows_per_unit,
    test_count_matches_truth_within_bound,
    test_cte_and_subquery_filters_are_answered,
    test_filtered_public_keys_only_return_the_filtered_values,
    test_having_order_limit_apply_to_noisy_values,
    test_public_group_keys_are_exactly_the_declared_values,
    test_public_tables_are_free_and_exact,
    test_sum_avg_variance_stddev_near_truth,
    test_thresholded_keys_released_only_above_tau,
    wide,
)
