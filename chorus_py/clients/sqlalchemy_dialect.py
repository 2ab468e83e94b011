"""A SQLAlchemy dialect over the DB-API driver, so SQLAlchemy and ``pandas.read_sql`` work.

Registered by entry point (``pyproject.toml``), so these URLs need no import::

    create_engine("chorus:///policy.toml?analyst=alice")          # relative policy path
    create_engine("chorus:////srv/chorus/policy.toml?analyst=alice&epsilon=0.1")
    create_engine("chorus+http://127.0.0.1:8000/?token=...")      # a remote proxy over REST
    create_engine("chorus+https://proxy.example/?token=...")

Query options: ``analyst``, ``token``, ``epsilon``, ``delta``, ``wait_seconds``, ``timeout``.
SQL is compiled with SQLAlchemy's generic compiler and ``named`` parameters, which the driver
binds as literals.
Reflection (table and column names, types) reads the policy, so ``inspect(engine)`` lists only
what an analyst may query.  There are no transactions: ``commit``/``rollback`` do nothing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import types as sqltypes
from sqlalchemy.engine import default
from sqlalchemy.engine.url import URL
from sqlalchemy.exc import ArgumentError

_TYPES: dict[str, type[sqltypes.TypeEngine[Any]]] = {
    "int": sqltypes.BIGINT, "integer": sqltypes.BIGINT, "float": sqltypes.FLOAT,
    "text": sqltypes.TEXT, "bool": sqltypes.BOOLEAN, "boolean": sqltypes.BOOLEAN,
    "date": sqltypes.DATE, "timestamp": sqltypes.TIMESTAMP,
}
_FLOAT_OPTIONS = ("epsilon", "delta", "wait_seconds", "timeout")
_TEXT_OPTIONS = ("analyst", "token")


class ChorusDialect(default.DefaultDialect):
    """``chorus://``: the engine in this process, on a policy file."""

    name = "chorus"
    driver = "chorus"
    supports_statement_cache = True
    default_paramstyle = "named"
    supports_native_boolean = True
    supports_native_decimal = False
    supports_sane_rowcount = False
    supports_sane_multi_rowcount = False
    supports_alter = False
    supports_sequences = False
    postfetch_lastrowid = False
    supports_default_values = False
    supports_empty_insert = False
    supports_multivalues_insert = False
    supports_is_distinct_from = True

    @classmethod
    def import_dbapi(cls) -> Any:
        from chorus_py.clients import dbapi

        return dbapi

    def create_connect_args(self, url: URL) -> tuple[list[Any], dict[str, Any]]:
        options = dict(url.query)
        kwargs: dict[str, Any] = {}
        for key in _TEXT_OPTIONS:
            if key in options:
                kwargs[key] = str(options.pop(key))
        for key in _FLOAT_OPTIONS:
            if key in options:
                try:
                    kwargs[key] = float(str(options.pop(key)))
                except ValueError:
                    raise ArgumentError(f"chorus URL option {key} must be a number") from None
        if options:
            raise ArgumentError(f"unknown chorus URL option(s): {', '.join(sorted(options))} "
                                f"(known: {', '.join(_TEXT_OPTIONS + _FLOAT_OPTIONS)})")
        return self._target(url, kwargs)

    def _target(self, url: URL, kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        if not url.database:
            raise ArgumentError("chorus URL needs a policy file: chorus:///policy.toml or "
                                "chorus:////absolute/policy.toml")
        if kwargs.get("token") is not None:
            raise ArgumentError("token is for remote proxies: chorus+http://host:port/?token=")
        kwargs.pop("timeout", None)
        return [], {"policy": url.database, **kwargs}

    # -- no transactions, no server-side session state
    def do_begin(self, dbapi_connection: Any) -> None:
        return None

    def do_rollback(self, dbapi_connection: Any) -> None:
        dbapi_connection.rollback()

    def do_commit(self, dbapi_connection: Any) -> None:
        dbapi_connection.commit()

    def do_ping(self, dbapi_connection: Any) -> bool:
        return not dbapi_connection.closed

    def _get_server_version_info(self, connection: Any) -> tuple[int, ...]:
        return (0,)

    def _get_default_schema_name(self, connection: Any) -> str | None:
        return None

    def get_default_isolation_level(self, dbapi_conn: Any) -> str:
        return "AUTOCOMMIT"

    def get_isolation_level(self, dbapi_connection: Any) -> str:
        return "AUTOCOMMIT"

    def get_isolation_level_values(self, dbapi_conn: Any) -> list[str]:
        return ["AUTOCOMMIT"]

    def set_isolation_level(self, dbapi_connection: Any, level: str) -> None:
        if level != "AUTOCOMMIT":
            raise ArgumentError("the chorus dialect only has AUTOCOMMIT (nothing is written)")

    def _check_max_identifier_length(self, connection: Any) -> int | None:
        return None

    # -- reflection: what the policy lets an analyst query
    def _tables(self, connection: Any) -> dict[str, dict[str, str]]:
        tables: dict[str, dict[str, str]] = connection.connection.dbapi_connection.tables()
        return tables

    def has_table(self, connection: Any, table_name: str, schema: str | None = None,
                  **kw: Any) -> bool:
        return table_name.lower() in self._tables(connection)

    def get_table_names(self, connection: Any, schema: str | None = None,
                        **kw: Any) -> list[str]:
        return sorted(self._tables(connection))

    def get_view_names(self, connection: Any, schema: str | None = None,
                       **kw: Any) -> list[str]:
        return []

    def get_schema_names(self, connection: Any, **kw: Any) -> list[str]:
        return []

    def get_columns(self, connection: Any, table_name: str, schema: str | None = None,
                    **kw: Any) -> list[dict[str, Any]]:
        columns = self._tables(connection).get(table_name.lower())
        if columns is None:
            from sqlalchemy.exc import NoSuchTableError

            raise NoSuchTableError(table_name)
        return [{"name": name, "type": _TYPES.get(kind, sqltypes.NullType)(),
                 "nullable": True, "default": None} for name, kind in columns.items()]

    def get_pk_constraint(self, connection: Any, table_name: str, schema: str | None = None,
                          **kw: Any) -> dict[str, Any]:
        return {"constrained_columns": [], "name": None}

    def get_foreign_keys(self, connection: Any, table_name: str, schema: str | None = None,
                         **kw: Any) -> list[Any]:
        return []

    def get_indexes(self, connection: Any, table_name: str, schema: str | None = None,
                    **kw: Any) -> list[Any]:
        return []


class ChorusHTTPDialect(ChorusDialect):
    """``chorus+http://host:port/?token=...``: a remote proxy's REST endpoint."""

    driver = "http"
    supports_statement_cache = True

    def _target(self, url: URL, kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        if not url.host:
            raise ArgumentError(f"chorus+{self.driver} URL needs a host: "
                                f"chorus+{self.driver}://host:8000/?token=...")
        host = f"[{url.host}]" if ":" in url.host else url.host
        port = f":{url.port}" if url.port else ""
        path = f"/{url.database}" if url.database else ""
        return [f"{self.driver}://{host}{port}{path}"], kwargs


class ChorusHTTPSDialect(ChorusHTTPDialect):
    """``chorus+https://host/?token=...``."""

    driver = "https"
    supports_statement_cache = True


dialect = ChorusDialect
