"""DP quantiles, MEDIAN, MIN and MAX on Spark (``chorus_py.kinds.quantile``, ``kinds.mixed``):
the same functions as on DuckDB and Postgres, on the small skewed tables of their modules (the
``scratch`` fixture writes them to Parquet), collected here with this package's fixtures.  The
histogram each quantile reads is an exact aggregate Spark returns; the exponential mechanism
draws the bin in the proxy, as on every backend."""

from tests.test_quantile_caps import (  # noqa: F401  (collected here with the Spark fixtures)
    test_a_mixed_query_chooses_each_parts_cap,
    test_the_cap_is_chosen_and_is_the_mechanisms_delta,
)
from tests.test_quantile_mixed import (  # noqa: F401
    skew,
    test_having_filters_on_the_noisy_count_it_shows,
    test_outputs_combining_quantiles_and_aggregates,
)
from tests.test_quantiles import (  # noqa: F401
    test_grouped_median_and_count_in_the_analysts_order,
    test_materialized_bounding_reads_the_stored_sample,
    test_median_is_near_the_true_median,
    test_min_max_avg_split_epsilon_by_measurements,
    test_percentiles_share_epsilon_and_one_scan,
    test_quantiles_grouped_by_a_thresholded_key,
    test_the_histogram_reads_the_ranked_copy,
)
