"""Demo data for ``chorus demo`` and the tests: synthetic rides (``rides``), the riders and
drivers behind them (``people``) and co-authored papers (``papers``), with their policy."""

from chorus_py.demo.rides import (
    CITY_NAMES,
    DEMO_TABLES,
    demo_loaded,
    generate_demo,
    generate_trips,
    render_policy,
)

__all__ = ["CITY_NAMES", "DEMO_TABLES", "demo_loaded", "generate_demo", "generate_trips",
           "render_policy"]
