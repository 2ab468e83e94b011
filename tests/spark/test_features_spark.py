"""The engine's feature tests on Spark, on small skewed tables of their own (the ``scratch``
fixture writes them to Parquet): automatic caps and clipping bounds, groups per unit,
materialized bounding, multi-attribution, sampled sensitivity.  The same functions as on DuckDB
and Postgres, collected here with this package's fixtures."""

from tests.test_attribution import (  # noqa: F401  (collected here with the Spark fixtures)
    test_attribution_table_queries,
)
from tests.test_caps import (  # noqa: F401
    exact_units,
    test_epsilon_adds_up_to_the_charge,
    test_materialized_sample_honours_the_chosen_cap,
)
from tests.test_clip_bounds import (  # noqa: F401
    test_fixed_cap_with_automatic_bounds,
    test_sum_and_avg_use_the_bound_where_the_values_are,
    values,
)
from tests.test_group_bounds import (  # noqa: F401
    spread,
    test_engine_chooses_g_and_releases_the_groups,
)
from tests.test_per_person import (  # noqa: F401
    test_filtered_distinct_units_of_one_table_are_a_per_person_count,
    test_filtered_distinct_units_skip_rows_without_a_unit,
)
from tests.test_sampling import (  # noqa: F401
    sampled_engine,
    test_grouped_ratio_and_count,
    test_median_and_nonlinear_sum_end_to_end,
)
