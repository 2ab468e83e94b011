"""benchmarks.peers: the demo policy as SmartNoise SQL's metadata and Qrlew's settings.

The comparison with the other DP SQL tools is only fair if each gets the demo policy's privacy
unit, contribution limit, bounds and public tables; these checks hold the conversion to
hand-written expected values.  They need neither the peers' virtual environment nor a
database.
"""

from __future__ import annotations

import tomllib

import pytest

from benchmarks.peers import peer_settings, qrlew_settings, smartnoise_metadata
from chorus_py.demo.rides import render_policy


@pytest.fixture(scope="module")
def policy() -> dict:
    return tomllib.loads(render_policy("postgresql://postgres@127.0.0.1:5432/demo"))


def test_smartnoise_metadata(policy: dict) -> None:
    meta = smartnoise_metadata(policy)
    tables = meta["demo"]["public"]
    # cities is public (SmartNoise has no public tables); papers' unit is an attribution
    # table (SmartNoise takes one private_id column per table): both left out.
    assert sorted(tables) == ["drivers", "riders", "trips"]
    assert tables["trips"] == {
        "row_privacy": False,
        "max_ids": 200,
        "sample_max_ids": True,
        "trip_id": {"type": "int"},
        "rider_id": {"type": "int", "private_id": True},
        "driver_id": {"type": "int"},
        "city": {"type": "string"},
        "pickup_time": {"type": "datetime"},
        "fare": {"type": "float", "lower": 0, "upper": 200},
        "distance_km": {"type": "float", "lower": 0, "upper": 100},
    }
    assert tables["riders"] == {
        "row_privacy": False,
        "max_ids": 1,
        "sample_max_ids": True,
        "rider_id": {"type": "int", "private_id": True},
        "signup_date": {"type": "datetime"},
        "home_city": {"type": "string"},
        "membership": {"type": "string"},
    }
    # Event level (no privacy unit): one row is one driver; no private_id column.
    assert tables["drivers"] == {
        "row_privacy": True,
        "driver_id": {"type": "int"},
        "city": {"type": "string"},
        "vehicle": {"type": "string"},
        "rating": {"type": "float", "lower": 1, "upper": 5},
    }


def test_qrlew_settings(policy: dict) -> None:
    settings = qrlew_settings(policy)
    assert settings["schema"] == "public"
    assert settings["privacy_unit"] == [
        ("trips", [], "rider_id"),
        ("riders", [], "rider_id"),
        ("drivers", [], "_PRIVACY_UNIT_ROW_"),
        ("papers", [], "_PRIVACY_UNIT_ROW_"),
    ]  # cities, public, absent: Qrlew treats tables outside the privacy unit as public
    assert settings["ranges"] == [
        ("trips", "fare", 0.0, 200.0),
        ("trips", "distance_km", 0.0, 100.0),
        ("drivers", "rating", 1.0, 5.0),
        ("papers", "citations", 0.0, 500.0),
    ]
    cities = ["SF", "NYC", "LA", "CHI", "SEA"]
    assert settings["possible_values"] == [
        ("trips", "city", cities),
        ("riders", "home_city", cities),
        ("riders", "membership", ["standard", "plus"]),
        ("drivers", "city", cities),
        ("drivers", "vehicle", ["sedan", "suv", "ev", "van"]),
        ("papers", "field", ["cs", "physics", "math", "bio", "econ"]),
    ]
    assert settings["max_multiplicity"] == 200


def test_same_epsilon_and_delta(policy: dict) -> None:
    settings = peer_settings(policy)
    for tool in ("smartnoise", "qrlew"):
        assert (settings[tool]["epsilon"], settings[tool]["delta"]) == (0.5, 1e-8)
