"""The policy file: parsing, every validation error, URL resolution, and start-up checks.

Every error must name the file, the key path (``tables.trips.columns.fare``) and what is
expected; checks against the live database run on DuckDB and on Postgres.
"""

from __future__ import annotations

import gc
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chorus_py.engine import Engine
from chorus_py.errors import PolicyError
from chorus_py.policy import Policy, load_policy, parse_policy

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

WritePolicy = Callable[..., Path]


def _variant(path: Path, *replacements: tuple[str, str]) -> Path:
    """Rewrite a policy file, each ``old`` text must be present."""
    text = path.read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new, 1)
    out = path.with_name(path.stem + "-variant.toml")
    out.write_text(text)
    return out


def _duckdb_file(duckdb_url: str) -> Path:
    path = Path(duckdb_url.removeprefix("duckdb:///"))
    assert path.is_absolute() and path.exists()
    return path


# -- a valid policy ---------------------------------------------------------------------------
def test_valid_policy_loads(duckdb_data: str, write_policy: WritePolicy) -> None:
    path = write_policy(duckdb_data)
    policy = load_policy(path)
    assert isinstance(policy, Policy)
    assert policy.source == str(path)
    assert policy.backend.url == duckdb_data  # four slashes: absolute, unchanged
    assert policy.backend.dialect == "duckdb"
    assert policy.privacy.epsilon_per_block == 1000.0
    assert policy.privacy.delta_per_block == 1e-3
    assert policy.privacy.accounting == "basic"
    trips = policy.table("TRIPS")
    assert trips is not None and policy.table("nope") is None
    assert trips.privacy_unit == "rider_id"
    assert trips.contribution_bound == 10
    assert trips.block is not None
    assert (trips.block.column, trips.block.seconds) == ("pickup_time", 86400)
    fare = trips.columns["fare"]
    assert (fare.type, fare.lower, fare.upper, fare.bounded) == ("float", 0, 200, True)
    assert trips.columns["city"].public_values == ("SF", "NYC", "LA", "CHI", "SEA")
    assert not trips.columns["city"].bounded
    assert trips.columns["rider_id"].private_id
    visits = policy.tables["visits"]
    assert visits.privacy_unit is None and visits.contribution_bound == 1  # event level
    assert policy.tables["cities"].public
    assert set(policy.analysts) == {"alice", "bob"}
    assert policy.analysts["bob"].max_epsilon_per_query == 0.5


@pytest.mark.parametrize(("size", "seconds"), [("1 hour", 3600), ("2 days", 172800),
                                               ("1 week", 604800), (" 30 minutes ", 1800)])
def test_block_sizes(duckdb_data: str, write_policy: WritePolicy, size: str,
                     seconds: int) -> None:
    # Boundaries lie on the size's grid from 1970-01-01; weeks begin on Mondays (ISO weeks).
    weekly = size == "1 week"
    start, end = ("2025-12-29", "2026-03-30") if weekly else ("2026-01-01", "2026-04-01")
    path = _variant(write_policy(duckdb_data), ('size = "1 day"', f'size = "{size}"'),
                    ('end = "2026-04-01"', f'end = "{end}"'),
                    ('start = "2026-01-01"', f'start = "{start}"'))
    block = load_policy(path).tables["trips"].block
    assert block is not None
    assert block.seconds == seconds and block.width.total_seconds() == seconds


def test_examples_policy_parses() -> None:
    policy = load_policy(EXAMPLES / "policy.toml")
    assert policy.backend.url == f"duckdb:///{(EXAMPLES / 'demo.duckdb').resolve()}"
    trips = policy.tables["trips"]
    assert trips.privacy_unit == "rider_id" and trips.max_rows_per_unit == 200
    assert trips.contribution == "auto"
    assert trips.columns["fare"].upper == 200
    assert policy.tables["cities"].public
    assert policy.privacy.default_epsilon <= policy.privacy.max_epsilon_per_query


# -- invalid files: file path, key path, and what is expected --------------------------------
TEXT_FARE = 'fare        = { type = "float", lower = 0, upper = 200 }'
TEXT_CITY = 'city        = { type = "text", public_values = ["SF", "NYC", "LA", "CHI", "SEA"] }'

INVALID = {
    "unknown top-level key": (
        [("[backend]", 'colour = "blue"\n\n[backend]')],
        "colour", "unknown key"),
    "unknown column key (typo uper)": (
        [(TEXT_FARE, 'fare = { type = "float", lower = 0, uper = 200 }')],
        "tables.trips.columns.fare.uper", "unknown key"),
    "unknown column type": (
        [(TEXT_FARE, 'fare = { type = "decimal", lower = 0, upper = 200 }')],
        "tables.trips.columns.fare.type", "'int', 'float', 'text'"),
    "only lower": (
        [(TEXT_FARE, 'fare = { type = "float", lower = 0 }')],
        "tables.trips.columns.fare", "give both lower and upper"),
    "only upper": (
        [(TEXT_FARE, 'fare = { type = "float", upper = 200 }')],
        "tables.trips.columns.fare", "give both lower and upper"),
    "lower above upper": (
        [(TEXT_FARE, 'fare = { type = "float", lower = 300, upper = 200 }')],
        "tables.trips.columns.fare", "lower must be <= upper"),
    "infinite bound": (
        [(TEXT_FARE, 'fare = { type = "float", lower = 0, upper = inf }')],
        "tables.trips.columns.fare.upper", "finite"),
    "bounds on a text column": (
        [(TEXT_CITY, 'city = { type = "text", lower = 0, upper = 5 }')],
        "tables.trips.columns.city", "bounds only apply to int or float columns, not text"),
    "empty public_values": (
        [(TEXT_CITY, 'city = { type = "text", public_values = [] }')],
        "tables.trips.columns.city", "public_values must list at least one value"),
    "privacy_unit not a declared column": (
        [('privacy_unit = "rider_id"', 'privacy_unit = "passenger_id"')],
        "tables.trips", "privacy_unit 'passenger_id' is not a declared column"),
    "max_rows_per_unit without privacy_unit": (
        [('privacy_unit = "rider_id"\n', "")],
        "tables.trips", "max_rows_per_unit needs a privacy_unit"),
    "privacy_unit without max_rows_per_unit": (
        [("max_rows_per_unit = 10\n", "")],
        "tables.trips", "needs max_rows_per_unit"),
    "max_rows_per_unit zero": (
        [("max_rows_per_unit = 10\n", "max_rows_per_unit = 0\n")],
        "tables.trips.max_rows_per_unit", "greater than 0"),
    "block column not a timestamp or date": (
        [('column = "pickup_time"', 'column = "fare"')],
        "tables.trips", "block column must be of type date or timestamp"),
    "block column not declared": (
        [('column = "pickup_time"', 'column = "dropoff_time"')],
        "tables.trips", "block column 'dropoff_time' is not a declared column"),
    "bad block size": (
        [('size = "1 day"', 'size = "1 fortnight"')],
        "tables.trips.block.size",
        "expected a window such as '1 hour', '1 day', '1 week' or '1 month'"),
    "public table with a privacy_unit": (
        [("[tables.cities]\npublic = true", '[tables.cities]\npublic = true\nprivacy_unit = "id"')],
        "tables.cities", "a public table takes no privacy_unit"),
    "private table without columns": (
        [("[tables.cities]\npublic = true", "[tables.cities]\npublic = false")],
        "tables.cities", "a private table must declare its columns"),
    "upper-case table name": (
        [("[tables.visits]\n[tables.visits.columns]", "[tables.Visits]\n[tables.Visits.columns]")],
        "tables", "lower case ('Visits')"),
    "negative epsilon_per_block": (
        [("epsilon_per_block = 1000.0", "epsilon_per_block = -1.0")],
        "privacy.epsilon_per_block", "greater than 0"),
    "infinite epsilon_per_block": (
        [("epsilon_per_block = 1000.0", "epsilon_per_block = inf")],
        "privacy.epsilon_per_block", "finite"),
    "delta_per_block of 1": (
        [("delta_per_block = 1e-3", "delta_per_block = 1")],
        "privacy.delta_per_block", "less than 1"),
    "default_epsilon above max_epsilon_per_query": (
        [("default_epsilon = 1.0", "default_epsilon = 600.0")],
        "privacy", "default_epsilon must not exceed max_epsilon_per_query"),
    "default_delta above max_delta_per_query": (
        [("default_delta = 1e-8", "default_delta = 1e-3")],
        "privacy", "default_delta must not exceed max_delta_per_query"),
    "max_epsilon_per_query above epsilon_per_block": (
        [("epsilon_per_block = 1000.0", "epsilon_per_block = 100.0")],
        "privacy", "max_epsilon_per_query must not exceed epsilon_per_block"),
    "min_epsilon_per_query above max_epsilon_per_query": (
        [("max_delta_per_query = 1e-4", "max_delta_per_query = 1e-4\nmin_epsilon_per_query = 600")],
        "privacy", "min_epsilon_per_query must not exceed max_epsilon_per_query"),
    "min_epsilon_per_query of 0": (
        [("max_delta_per_query = 1e-4", "max_delta_per_query = 1e-4\nmin_epsilon_per_query = 0")],
        "privacy.min_epsilon_per_query", "greater than 0"),
    "default_epsilon below min_epsilon_per_query": (
        [("max_delta_per_query = 1e-4", "max_delta_per_query = 1e-4\nmin_epsilon_per_query = 2")],
        "privacy", "default_epsilon must not be below min_epsilon_per_query"),
    "an analyst's max_epsilon_per_query below the floor": (
        [("max_delta_per_query = 1e-4", "max_delta_per_query = 1e-4\nmin_epsilon_per_query = 0.6"),
         ("default_epsilon = 1.0", "default_epsilon = 1.0")],
        "(top level)", "analysts.bob.max_epsilon_per_query (0.5) is below "
        "privacy.min_epsilon_per_query (0.6)"),
    "unknown noise": (
        [('noise = "sql"', 'noise = "client"')],
        "privacy.noise", "'sql' or 'proxy'"),
    "epsilon as a string": (
        [("epsilon_per_block = 1000.0", 'epsilon_per_block = "lots"')],
        "privacy.epsilon_per_block", "valid number"),
    "backend URL with an unknown scheme": (
        [('url = "duckdb:', 'url = "mysql:')],
        "backend.url", "expected a URL starting with duckdb://, postgresql://, spark://local or sc://"),
    "missing privacy section": (
        [("[privacy]", "[privacy_settings]")],
        "privacy", "required key is missing"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_policy(case: str, duckdb_data: str, write_policy: WritePolicy) -> None:
    replacements, key, expected = INVALID[case]
    path = _variant(write_policy(duckdb_data), *replacements)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    err = info.value
    assert err.sqlstate == "F0000"
    message = str(err)
    assert f"{path}: {key}: " in message, message
    assert expected in message, message


def test_every_error_is_reported_on_its_own_line(duckdb_data: str,
                                                 write_policy: WritePolicy) -> None:
    path = _variant(write_policy(duckdb_data),
                    (TEXT_FARE, 'fare = { type = "float", lower = 0, uper = 200 }'),
                    ('size = "1 day"', 'size = "1 fortnight"'),
                    ('url = "duckdb:', 'url = "mysql:'))
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    lines = str(info.value).splitlines()
    assert len(lines) == 3, lines
    assert all(line.startswith(f"{path}: ") for line in lines)
    keys = {line.split(": ")[1] for line in lines}
    assert keys == {"backend.url", "tables.trips.block.size", "tables.trips.columns.fare.uper"}


def test_not_toml(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[backend]\nurl = "duckdb:///x.duckdb"\n[privacy\nepsilon_per_block = 1\n')
    with pytest.raises(PolicyError, match="not valid TOML") as info:
        load_policy(path)
    assert str(path) in str(info.value)
    assert "line 3" in str(info.value)  # where the problem is


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_bytes(b'[backend]\nurl = "\xff\xfe"\n')
    with pytest.raises(PolicyError, match="not valid TOML") as info:
        load_policy(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "policy.toml"
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(info.value) == f"{path}: cannot read the policy file (No such file or directory)"


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read the policy file") as info:
        load_policy(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_top_level_source_key_is_unknown(duckdb_data: str, write_policy: WritePolicy) -> None:
    # Regression: `source` is an internal field (the file name); parse_policy used to overwrite
    # a `source` key from the file silently instead of rejecting it.
    path = _variant(write_policy(duckdb_data), ("[backend]", 'source = "x"\n\n[backend]'))
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert f"{path}: source: unknown key" in str(info.value)


def test_parse_policy_names_its_source() -> None:
    data = {"backend": {"url": "duckdb:///:memory:"}, "privacy": {"epsilon_per_block": 0}}
    with pytest.raises(PolicyError) as info:
        parse_policy(data)
    message = str(info.value)
    assert "<memory>: privacy.epsilon_per_block: " in message
    assert "<memory>: tables: required key is missing" in message
    with pytest.raises(PolicyError, match=r"^inline: "):
        parse_policy(data, source="inline")


def test_parse_policy_leaves_urls_alone() -> None:
    policy = parse_policy({"backend": {"url": "duckdb:///rel.duckdb"},
                           "privacy": {"epsilon_per_block": 1.0},
                           "tables": {"t": {"public": True}}})
    assert policy.backend.url == "duckdb:///rel.duckdb"
    assert policy.source == "<memory>"
    assert parse_policy({"backend": {"url": "postgres://u@h/db"},
                         "privacy": {"epsilon_per_block": 1.0},
                         "tables": {}}).backend.dialect == "postgres"


# -- check_against (no database) ------------------------------------------------------------
def test_check_against(duckdb_data: str, write_policy: WritePolicy) -> None:
    path = write_policy(duckdb_data)
    policy = load_policy(path)
    live = {
        "trips": dict.fromkeys(["trip_id", "rider_id", "driver_id", "city", "pickup_time",
                                "fare", "distance_km", "extra"], "integer"),
        "visits": dict.fromkeys(["visit_id", "page", "seconds"], "integer"),
        "cities": {"name": "text"},
        "unrelated": {"x": "integer"},
    }
    policy.check_against(live)  # extra tables and columns in the database are fine
    without_visits = {k: v for k, v in live.items() if k != "visits"}
    with pytest.raises(PolicyError) as info:
        policy.check_against(without_visits)
    assert f"{path}: tables.visits: the database has no table 'visits'" in str(info.value)
    no_fare = {**live, "trips": {k: v for k, v in live["trips"].items() if k != "fare"}}
    with pytest.raises(PolicyError) as info:
        policy.check_against(no_fare)
    assert f"{path}: tables.trips.columns.fare: the table 'trips' has no column 'fare'" in str(
        info.value)
    assert "distance_km" in (info.value.hint or "")


# -- start-up checks against the database (DuckDB and Postgres) ------------------------------
@pytest.fixture
def collect_leaked_backends() -> Iterator[None]:
    """Should a failed Engine leave its backend open again, free it after the test so the shared
    DuckDB file is not held open with the proxy's configuration by other tests."""
    yield
    gc.collect()


def _policy_for(backend_url: str, write_policy: WritePolicy, *replacements: tuple[str, str],
                extra: str = "") -> Path:
    return _variant(write_policy(backend_url, extra=extra), *replacements)


def test_engine_starts_on_a_valid_policy(backend_url: str, write_policy: WritePolicy) -> None:
    path = write_policy(backend_url)
    with Engine(load_policy(path)) as engine:
        assert engine.dialect == ("duckdb" if backend_url.startswith("duckdb") else "postgres")
        assert "cities" in engine.public_columns
    with Engine.from_policy(path) as engine:
        assert engine.policy.source == str(path)


def test_engine_accepts_int_column_declared_float(backend_url: str,
                                                  write_policy: WritePolicy) -> None:
    path = _policy_for(backend_url, write_policy,
                       ('trip_id     = { type = "int" }', 'trip_id = { type = "float" }'))
    Engine(load_policy(path)).close()


@pytest.mark.usefixtures("collect_leaked_backends")
def test_engine_refuses_a_table_the_database_lacks(backend_url: str,
                                                   write_policy: WritePolicy) -> None:
    path = _policy_for(backend_url, write_policy,
                       extra='\n[tables.ghosts]\n[tables.ghosts.columns]\nx = { type = "int" }\n')
    with pytest.raises(PolicyError) as info:
        Engine(load_policy(path))
    assert f"{path}: tables.ghosts: the database has no table 'ghosts'" in str(info.value)


@pytest.mark.usefixtures("collect_leaked_backends")
def test_engine_refuses_a_column_the_database_lacks(backend_url: str,
                                                    write_policy: WritePolicy) -> None:
    path = _policy_for(backend_url, write_policy,
                       (TEXT_FARE, TEXT_FARE + '\ntip = { type = "float", lower = 0, upper = 50 }'))
    with pytest.raises(PolicyError) as info:
        Engine(load_policy(path))
    message = str(info.value)
    assert f"{path}: tables.trips.columns.tip: the table 'trips' has no column 'tip'" in message
    assert "fare" in message  # the hint lists the real columns


@pytest.mark.usefixtures("collect_leaked_backends")
@pytest.mark.parametrize(("old", "new", "key", "declared", "actual"), [
    (TEXT_CITY, 'city = { type = "int" }', "tables.trips.columns.city", "int", "text"),
    (TEXT_FARE, 'fare = { type = "int", lower = 0, upper = 200 }', "tables.trips.columns.fare",
     "int", "float"),
    ('pickup_time = { type = "timestamp" }', 'pickup_time = { type = "date" }',
     "tables.trips.columns.pickup_time", "date", "timestamp"),
    ('page     = { type = "text" }', 'page = { type = "bool" }', "tables.visits.columns.page",
     "bool", "text"),
])
def test_engine_refuses_a_type_the_database_disagrees_with(
        backend_url: str, write_policy: WritePolicy, old: str, new: str, key: str,
        declared: str, actual: str) -> None:
    path = _policy_for(backend_url, write_policy, (old, new))
    with pytest.raises(PolicyError) as info:
        Engine(load_policy(path))
    message = str(info.value)
    assert f"{path}: {key}.type: declared '{declared}' but the database column is {actual}" in (
        message)


# -- relative and absolute DuckDB URLs --------------------------------------------------------
def test_relative_duckdb_url_resolves_next_to_the_policy(
        duckdb_data: str, write_policy: WritePolicy, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = tmp_path / "project" / "data"
    data_dir.mkdir(parents=True)
    shutil.copy(_duckdb_file(duckdb_data), data_dir / "demo.duckdb")
    policy_path = _variant(write_policy(duckdb_data), (duckdb_data, "duckdb:///demo.duckdb"))
    shutil.move(policy_path, data_dir / "policy.toml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    expected = f"duckdb:///{(data_dir / 'demo.duckdb').resolve()}"
    for given in (data_dir / "policy.toml", Path("../project/data/policy.toml")):
        policy = load_policy(given)
        assert policy.backend.url == expected
        assert policy.backend.url.startswith("duckdb:////")
    with Engine(load_policy("../project/data/policy.toml")) as engine:
        result = engine.execute("SELECT COUNT(*) AS n FROM trips", analyst="alice",
                                epsilon=100.0)
    assert result.rows[0][0] > 0
    assert not (elsewhere / "demo.duckdb").exists()


def test_relative_duckdb_url_in_a_subdirectory(duckdb_data: str, write_policy: WritePolicy,
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "conf" / "db").mkdir(parents=True)
    shutil.copy(_duckdb_file(duckdb_data), tmp_path / "conf" / "db" / "x.duckdb")
    path = _variant(write_policy(duckdb_data), (duckdb_data, "duckdb:///db/x.duckdb"))
    shutil.move(path, tmp_path / "conf" / "p.toml")
    monkeypatch.chdir("/")
    policy = load_policy(tmp_path / "conf" / "p.toml")
    assert policy.backend.url == f"duckdb:///{(tmp_path / 'conf' / 'db' / 'x.duckdb').resolve()}"
    Engine(policy).close()


def test_four_slash_duckdb_url_stays_absolute(duckdb_data: str, write_policy: WritePolicy,
                                              tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_policy(duckdb_data)
    assert duckdb_data.startswith("duckdb:////")
    other = tmp_path / "other"
    other.mkdir()
    moved = other / "policy.toml"
    shutil.copy(path, moved)
    monkeypatch.chdir(tmp_path)
    policy = load_policy(Path("other/policy.toml"))
    assert policy.backend.url == duckdb_data
    Engine(policy).close()


def test_in_memory_duckdb_url_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[backend]\nurl = "duckdb:///:memory:"\n[privacy]\nepsilon_per_block = 1.0\n'
                    "[tables.t]\npublic = true\n")
    assert load_policy(path).backend.url == "duckdb:///:memory:"


def test_relative_url_to_a_missing_file_fails_at_start_up(tmp_path: Path) -> None:
    from chorus_py.errors import OperationalError

    path = tmp_path / "p.toml"
    path.write_text('[backend]\nurl = "duckdb:///missing.duckdb"\n[privacy]\n'
                    "epsilon_per_block = 1.0\n[tables.t]\npublic = true\n")
    with pytest.raises(OperationalError) as info:
        Engine(load_policy(path))
    assert str(tmp_path / "missing.duckdb") in str(info.value)


def test_failed_start_up_closes_the_backend(duckdb_data: str, write_policy: WritePolicy,
                                            tmp_path: Path) -> None:
    # Regression: Engine.__init__ used to raise from check_against/_check_types without closing
    # the backend it had opened, so the DuckDB file stayed open (and locked against other
    # processes) for as long as the exception's traceback lived.
    import duckdb

    copy = tmp_path / "own.duckdb"
    shutil.copy(_duckdb_file(duckdb_data), copy)
    path = _variant(write_policy(f"duckdb:///{copy}"), (TEXT_CITY, 'city = { type = "int" }'))
    with pytest.raises(PolicyError) as info:
        Engine(load_policy(path))
    assert info.value is not None  # the caller still holds the error, e.g. to log it
    con = duckdb.connect(str(copy))  # a different configuration: only works if it was closed
    con.close()


@pytest.mark.parametrize(("url", "written", "noise"), [
    ("duckdb:///demo.duckdb", "", "proxy"),  # embedded: in the proxy's process either way
    ("duckdb:///demo.duckdb", 'noise = "sql"', "sql"),  # as the owner says
    ("postgresql://u@h/db", "", "sql"),  # the exact aggregates stay in Postgres
    ("postgresql://u@h/db", 'noise = "proxy"', "proxy"),
])
def test_where_the_noise_is_drawn_by_default(url: str, written: str, noise: str) -> None:
    import tomllib

    policy = parse_policy(tomllib.loads(
        f'[backend]\nurl = "{url}"\n[privacy]\nepsilon_per_block = 1.0\n{written}\n[tables]\n'))
    assert policy.privacy.noise == noise
