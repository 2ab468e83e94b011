"""The Apache Spark backend (pyspark 4): an in-process local Spark (``url = "spark://local"``)
or a cluster through Spark Connect (``url = "sc://host:port"``), reading the policy's Parquet
tables.

Spark has no read-only transaction and no roles.  The walls that make it read-only here:

1. **A catalog of the declared tables only.**  Each backend has a Spark session of its own whose
   tables are temporary views over the declared Parquet files (``[backend.spark]``), named as
   ``session.<table>`` in the generated SQL; views the policy does not declare are dropped at
   start (:meth:`SparkBackend.restrict_public`).  SQL on files (``parquet.`/path```) is off
   (``spark.sql.runSQLOnFiles``).  Public-only queries run on a second session holding views of
   the public tables alone.  What the proxy stores (bounded samples, kept sets) lives in the
   database ``chorus_private``, located in the policy's private directory.
2. **Only SELECT is ever sent.**  :func:`spark_statement_check` parses every statement before
   Spark sees it, the way Spark will parse it (double quotes are identifiers): one query (or
   EXPLAIN of one), reading only tables, not files or table functions, and calling no function
   that reaches outside the rows (``reflect``, ``java_method``, ``input_file_name``...) or draws a
   random number.  ``SET``, ``CREATE``, ``INSERT``, ``CACHE``, ``ADD JAR`` never reach Spark
   from :meth:`SparkBackend.run`; only :meth:`SparkBackend.run_owned` (the proxy's own stores,
   never analyst SQL) writes, and only into ``chorus_private``.
3. **No ``rand()``.**  Spark evaluates ``rand()`` per partition and again on a retried task, so
   the rewriters' row ranks become a keyed hash (``rewriters.dialect``): the parameter
   ``:chorus_key`` is bound here to a fresh 63-bit secret from :mod:`secrets` for every
   statement (never in the SQL text, never logged), and noise is added by the proxy
   (``privacy.noise = "proxy"``, the policy's only choice on Spark).

**Spark Connect** (``sc://``) keeps the same walls with the client's own means, on a server the
proxy does not configure: each backend session is a Connect session of its own (the server
isolates their temporary views and settings), the settings above are set on it and read back
(a server that will not take them is refused at start), tables are registered from Parquet
paths the *cluster* reads, and a statement is cancelled by its session tag (``addTag`` /
``interruptTag``) where a local Spark cancels its job group.  ``chorus_private`` is a database
of the server's catalog, located in a fresh directory under ``private_dir`` (a path of the
cluster's filesystem; an earlier run's directories cannot be deleted from here), and the naming
key is a table in it, written as data, never in SQL text.  Statements are SQL only: no UDF, no
Python code runs on the cluster.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import threading
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark

from chorus_py.backends.base import SCHEMA, Backend, ResultSet, StatementFailed, portable_type
from chorus_py.backends.cancel import Stop, cancellable
from chorus_py.errors import OperationalError
from rewriters.dialect import SPARK_KEY

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from chorus_py.policy import SparkConfig

log = logging.getLogger("chorus.backends")

#: The schema that qualifies a session's temporary views (``session.trips``).
SESSION_SCHEMA = "session"

# Functions no statement may call: they read outside the rows of the declared tables (files,
# the JVM, the user), depend on where or how often a row is evaluated (random draws, partition
# ids), or raise on purpose (an error would tell a row's value).
_REFUSED_FUNCTIONS = frozenset({
    "reflect", "java_method", "try_reflect", "input_file_name", "input_file_block_start",
    "input_file_block_length", "read_files", "rand", "randn", "random", "uniform", "randstr",
    "uuid", "shuffle", "spark_partition_id", "monotonically_increasing_id", "current_user",
    "user", "session_user", "assert_true", "raise_error", "current_catalog", "version",
    "url_decode", "url_encode", "parse_url", "from_avro", "to_avro", "from_protobuf",
    "to_protobuf", "xpath", "schema_of_json", "schema_of_csv", "schema_of_xml", "udf",
})
# Session settings of every backend session (the rest come from the process's Spark):
_SESSION_CONF = {
    # ANSI: overflow and invalid casts raise, as on Postgres, which the totality analysis
    # already proves impossible (analyses.totality treats Spark as strictly as Postgres).
    "spark.sql.ansi.enabled": "true",
    # "x" is an identifier, as in the SQL the proxy's stores write for every backend.
    "spark.sql.ansi.doubleQuotedIdentifiers": "true",
    # No parquet.`/path`: a statement reads the catalog's tables, never a file by name.
    "spark.sql.runSQLOnFiles": "false",
    "spark.sql.session.timeZone": "UTC",
}

# (Parquet path, modification time) -> the Spark schema read from its files.
_SCHEMAS: dict[tuple[str, int], Any] = {}
_PROCESS_LOCK = threading.Lock()
_PROCESS_SPARK: SparkSession | None = None


class _SparkAsRun(Spark):
    """Spark SQL as the backend sessions parse it: double quotes are identifiers."""

    class Tokenizer(Spark.Tokenizer):
        QUOTES: ClassVar[list[str]] = ["'"]
        IDENTIFIERS: ClassVar[list[str]] = ["`", '"']


def spark_statement_check(sql: str) -> None:
    """Refuse (ValueError) any statement but one query, or EXPLAIN of one, that reads tables
    only and calls no function of ``_REFUSED_FUNCTIONS``.

    >>> spark_statement_check("SELECT COUNT(*) FROM session.trips")
    >>> spark_statement_check("SET spark.sql.runSQLOnFiles = true")
    Traceback (most recent call last):
    ...
    ValueError: not a query: only SELECT statements are sent to Spark
    """
    text = sql.strip()
    if text[:8].upper() == "EXPLAIN ":
        text = text[8:]
    try:
        statements = [s for s in sqlglot.parse(text, read=_SparkAsRun) if s is not None]
    except sqlglot.errors.SqlglotError:
        raise ValueError("the statement does not parse as Spark SQL") from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Query):
        raise ValueError("not a query: only SELECT statements are sent to Spark")
    for node in statements[0].walk():
        if isinstance(node, exp.DDL | exp.DML | exp.Command | exp.Set | exp.Rand | exp.Randn
                      | exp.Uuid):
            raise ValueError(f"{type(node).__name__} is never sent to Spark")
        if isinstance(node, exp.Func):
            name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
            if name in _REFUSED_FUNCTIONS:
                raise ValueError(f"the function {name} is never sent to Spark")
        if isinstance(node, exp.Table) and not isinstance(node.this, exp.Identifier):
            raise ValueError("a table function or file is never read by Spark")
        if isinstance(node, exp.Table) and node.args.get("catalog") is not None:
            raise ValueError("a table of another catalog is never read by Spark")
        if isinstance(node, exp.Table) and node.db and node.db.lower() not in (
                SESSION_SCHEMA, SCHEMA):
            raise ValueError(f"the schema {node.db} is not one Spark reads for the proxy")


def _quiet() -> None:
    """Spark's own logger would print every failed statement's message, which may quote a
    value of a row: operators get them from chorus.backends at debug level.  pyspark's warning
    about pandas 3 is not the proxy's: it collects rows, never pandas frames."""
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL + 1)
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas",
                            category=FutureWarning)


def _spark(config: SparkConfig) -> SparkSession:
    """The process's Spark (pyspark runs one SparkContext per process): created by the first
    backend, its static settings (the private warehouse) fixed from then on."""
    global _PROCESS_SPARK
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise OperationalError("the Spark backend needs pyspark 4",
                               hint="pip install 'chorus-py[spark]' (and Java 17)") from None
    with _PROCESS_LOCK:
        if _PROCESS_SPARK is None:
            assert config.private_dir is not None
            _quiet()
            master = f"local[{config.cores or '*'}]"
            try:
                builder = (SparkSession.builder.master(master).appName("chorus")
                           .config("spark.ui.enabled", "false")
                           .config("spark.ui.showConsoleProgress", "false")
                           .config("spark.sql.catalogImplementation", "in-memory")
                           .config("spark.sql.warehouse.dir", str(Path(config.private_dir)))
                           .config("spark.sql.shuffle.partitions",
                                   str(config.shuffle_partitions)))
                for key, value in _SESSION_CONF.items():
                    builder = builder.config(key, value)
                _PROCESS_SPARK = builder.getOrCreate()
                _PROCESS_SPARK.sparkContext.setLogLevel("ERROR")
            except Exception as err:  # Java missing, a port taken...: the owner must know
                raise OperationalError(f"cannot start a local Spark: {err}",
                                       hint="the Spark backend needs Java 17 or later "
                                            "(java -version)") from None
        return _PROCESS_SPARK


def _connect(url: str) -> SparkSession:
    """A new Spark Connect session on the server at ``url`` (each one is isolated there)."""
    # The client connects lazily and retries a refused connection for minutes: a server that
    # is not there is told at start, in seconds.
    address = urlsplit(url.split("/;")[0])
    try:
        socket.create_connection((address.hostname or "", address.port or 15002), 10).close()
    except OSError as err:
        raise OperationalError(f"cannot connect to Spark at {url}: {err}",
                               hint="is the Spark Connect server running at that address?"
                               ) from None
    try:
        # The Connect client's own builder: pyspark's generic one marks the whole process as
        # Spark Connect (an environment variable), after which no local Spark can be used.
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        _quiet()
        return ConnectSession.builder.remote(url).create()  # type: ignore[return-value]
    except ImportError as err:
        raise OperationalError(f"Spark Connect needs pyspark's client libraries: {err}",
                               hint="pip install 'chorus-py[spark-connect]'") from None
    except Exception as err:  # the server down, a wrong port...: the owner must know
        raise OperationalError(f"cannot connect to Spark at {url}: "
                               f"{str(err).splitlines()[0]}",
                               hint="is the Spark Connect server running at that address?"
                               ) from None


class SparkBackend(Backend):
    """A Spark session, local or through Spark Connect (``remote``, an ``sc://`` URL), over
    the policy's Parquet tables (module docstring: the walls)."""

    dialect = "spark"

    def __init__(self, config: SparkConfig, statement_timeout_s: float = 300.0,
                 remote: str | None = None) -> None:
        assert config.private_dir is not None  # load_policy resolves it, sc:// requires it
        self._config = config
        self._timeout_s = statement_timeout_s
        self._remote = remote
        self._private = config.private_dir
        if remote is None:
            base = _spark(config)
            self._sc = base.sparkContext
            self._session = self._new_session(base)
        else:
            self._session = self._new_session(None)
        self._public: SparkSession | None = None
        self._paths = _table_paths(config)
        for name, path in self._paths.items():
            self._register(self._session, name, path)
        self._open_private()

    # -- sessions -------------------------------------------------------------------------------
    def _new_session(self, base: SparkSession | None) -> SparkSession:
        """A session of its own: temporary views and settings no other backend shares."""
        if self._remote is None:
            assert base is not None
            session = base.newSession()
            for key, value in _SESSION_CONF.items():
                session.conf.set(key, value)
            return session
        session = _connect(self._remote)
        settings = {**_SESSION_CONF,
                    "spark.sql.shuffle.partitions": str(self._config.shuffle_partitions)}
        try:
            for key, value in settings.items():
                session.conf.set(key, value)
            # Read back: a server that ignored or overrode one (a static setting, a policy of
            # its own) would run without that wall.
            wrong = [key for key, value in settings.items()
                     if str(session.conf.get(key)).lower() != value.lower()]
            problem = f"does not take the settings {', '.join(wrong)}" if wrong else None
        except Exception as err:
            problem = f"refuses a setting: {str(err).splitlines()[0]}"
        if problem is not None:
            session.stop()
            raise OperationalError(f"the Spark Connect server at {self._remote} {problem}",
                                   hint="the proxy refuses a Spark that would run without them")
        return session

    def _register(self, session: SparkSession, name: str, path: str) -> None:
        try:
            if self._remote is not None:  # the cluster's path: not one this machine can stat
                session.read.parquet(path).createOrReplaceTempView(name)
                return
            # The schema read from the files once per version of them (reading the Parquet
            # footers again costs each new session a round of file reads).
            stamp = (path, os.stat(path).st_mtime_ns)
            schema = _SCHEMAS.get(stamp)
            reader = session.read if schema is None else session.read.schema(schema)
            frame = reader.parquet(path)
            _SCHEMAS[stamp] = frame.schema
            frame.createOrReplaceTempView(name)
        except Exception as err:
            raise OperationalError(f"cannot read the Parquet table {name} at {path}: "
                                   f"{str(err).splitlines()[0]}",
                                   hint="fix [backend.spark] tables or warehouse in the policy"
                                   ) from None

    def _open_private(self) -> None:
        """The database ``chorus_private`` in the private directory (owner-only).

        The catalog is in memory: after a restart it no longer lists the tables a previous run
        stored, whose directories would block their re-creation; they are deleted (a stored
        sample is rebuilt on first use, the same rows for the same data and key)."""
        if self._remote is not None:
            self._open_remote_private()
            return
        private = Path(self._private)
        private.mkdir(parents=True, exist_ok=True)
        os.chmod(private, 0o700)
        location = private / f"{SCHEMA}.db"
        if not self._session.catalog.databaseExists(SCHEMA):
            if location.exists():
                for entry in location.iterdir():
                    if entry.is_dir():
                        shutil.rmtree(entry)
            self._session.sql(f"CREATE DATABASE IF NOT EXISTS {SCHEMA} "
                              f"LOCATION '{_sql_string(str(location))}'")
        found = self._session.sql(f"DESCRIBE DATABASE {SCHEMA}").collect()
        where = next((str(r[1]) for r in found if str(r[0]).lower() == "location"), "")
        if where.removeprefix("file:").rstrip("/") != str(location).rstrip("/"):
            raise OperationalError(
                f"this process's Spark keeps {SCHEMA} in {where}, not in {location}",
                hint="one proxy process serves one Spark policy: start another process")

    def _open_remote_private(self) -> None:
        """``chorus_private`` on a Spark Connect server: kept by the server's catalog between
        proxy runs (and shared by its sessions), so it is reused when it lies under
        ``private_dir``, refused when it lies elsewhere (another proxy's, or not the proxy's
        at all).  A new one gets a fresh directory: the directories of stores an earlier
        server forgot cannot be deleted from here, and would block their re-creation."""
        root = self._private.rstrip("/")
        if not self._session.catalog.databaseExists(SCHEMA):
            location = f"{root}/{SCHEMA}-{uuid.uuid4().hex[:12]}.db"
            self._session.sql(f"CREATE DATABASE IF NOT EXISTS {SCHEMA} "
                              f"LOCATION '{_sql_string(location)}'")
        found = self._session.sql(f"DESCRIBE DATABASE {SCHEMA}").collect()
        where = next((str(r[1]) for r in found if str(r[0]).lower() == "location"), "")
        if not _under(where, root):
            raise OperationalError(
                f"the Spark Connect server keeps {SCHEMA} in {where}, not under {root}",
                hint="set [backend.spark] private_dir to that directory's parent, or drop "
                     f"the database {SCHEMA} on the server")

    # -- statements -----------------------------------------------------------------------------
    def run(self, sql: str) -> ResultSet:
        return self._run_on(self._session, sql)

    def run_public(self, sql: str) -> ResultSet:
        if self._public is None:
            return super().run_public(sql)
        return self._run_on(self._public, sql)

    def _run_on(self, session: SparkSession, sql: str) -> ResultSet:
        try:
            spark_statement_check(sql)
        except ValueError as err:
            raise StatementFailed(False, f"refused before Spark: {err}") from None
        return self._execute(session, sql)

    def _execute(self, session: SparkSession, sql: str) -> ResultSet:
        """Run ``sql`` on ``session`` with a fresh key bound, cancellable, timed."""
        from pyspark.errors import AnalysisException, ParseException

        group = uuid.uuid4().hex
        stop: Stop | None = None
        try:
            # A job group per statement (a session tag on Spark Connect, set for this thread
            # only): a cancel or the timeout stops this statement's Spark jobs only.
            if self._remote is None:
                self._sc.setJobGroup(group, "chorus statement", interruptOnCancel=True)
                cancel = lambda: self._sc.cancelJobGroup(group)  # noqa: E731
            else:
                session.addTag(group)
                cancel = lambda: session.interruptTag(group)  # noqa: E731
            with cancellable(cancel, self._timeout_s) as stop:
                frame = session.sql(sql, args=_key_args(sql))
                rows = [tuple(r) for r in frame.collect()]
                fields = frame.schema.fields
        except (AnalysisException, ParseException) as err:
            # Spark analyses a statement completely before running it: nothing was read.
            raise StatementFailed(False, str(err)) from None
        except Exception as err:
            if stop is not None and stop.reason is not None:
                raise StatementFailed(True, str(err), cancelled=stop.reason) from None
            raise StatementFailed(True, str(err)) from None
        finally:
            if self._remote is None:
                self._sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            else:
                session.removeTag(group)
        return ResultSet(tuple(f.name for f in fields),
                         tuple(portable_type(f.dataType.simpleString()) for f in fields), rows)

    def run_owned(self, statements: Sequence[str]) -> None:
        """The proxy's own writes, into ``chorus_private`` only (Spark has no transactions: a
        statement that fails leaves the earlier ones done, and the store rebuilds)."""
        key = _key_args(" ".join(statements))
        for statement in statements:
            self._session.sql(statement, args=key if f":{SPARK_KEY}" in statement else None)

    def owned_key(self, create: Sequence[str]) -> bytes:
        """The proxy's naming key, in an owner-only file of the private directory (``create``,
        the other backends' table, is not run: Spark has no INSERT ... ON CONFLICT).  On Spark
        Connect, where that directory is the cluster's, a table of ``chorus_private`` holds it,
        written as data (the key never appears in a statement's text)."""
        if self._remote is not None:
            return self._remote_key()
        path = Path(self._private) / "chorus_key"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(32))
        return bytes.fromhex(path.read_text().strip())

    def _remote_key(self) -> bytes:
        table = f"{SCHEMA}.chorus_key"
        if not self._session.catalog.tableExists(table):
            frame = self._session.createDataFrame([(secrets.token_hex(32),)], "k string")
            try:
                frame.write.saveAsTable(table)  # fails if another proxy wrote it first
            except Exception as err:
                log.debug("the naming key was written meanwhile: %s", err)
        (row,) = self._session.table(table).collect()
        return bytes.fromhex(str(row[0]))

    def owned_tables(self) -> tuple[str, ...]:
        # SHOW TABLES, not catalog.listTables, which reads every table's metadata (seconds).
        return tuple(str(r[1]) for r in self._session.sql(f"SHOW TABLES IN {SCHEMA}").collect()
                     if not r[2])

    def current_schema(self) -> str:
        return SESSION_SCHEMA

    def table_columns(self) -> dict[str, dict[str, str]]:
        return {name: {f.name: portable_type(f.dataType.simpleString())
                       for f in self._session.table(name).schema.fields}
                for name in self._paths}

    def restrict_public(self, public: Sequence[str], private: Sequence[str],
                        public_url: str | None = None,
                        refresh_seconds: float = 60.0) -> tuple[str, ...]:
        """Drop the views the policy does not declare, and open the public session: views of
        the ``public`` tables only (Spark has no roles: a session that has no view of a private
        table cannot read it).  ``public_url`` is a Postgres setting: refused here."""
        if public_url is not None:
            raise OperationalError("backend.public_url is for a Postgres backend",
                                   hint="remove it: on Spark public queries run on a session "
                                        "holding the public tables only")
        declared = set(public) | set(private)
        for name in list(self._paths):
            if name not in declared:
                self._session.catalog.dropTempView(name)
                del self._paths[name]
        self._public = self._new_session(self._session)  # Connect: a new server session
        for name in public:
            if name in self._paths:
                self._register(self._public, name, self._paths[name])
        return ()

    def close(self) -> None:
        """The process's Spark stays up for the next backend (starting one takes seconds); a
        Spark Connect session is released on the server."""
        for session in (self._session, self._public):
            if session is not None:
                for name in self._paths:
                    session.catalog.dropTempView(name)
                if self._remote is not None:
                    session.stop()


def _table_paths(config: SparkConfig) -> dict[str, str]:
    """Table name -> Parquet path: the explicit ``tables``, then ``<name>.parquet`` entries
    of the ``warehouse`` directory."""
    paths: dict[str, str] = {}
    if config.warehouse is not None:
        directory = Path(config.warehouse)
        if not directory.is_dir():
            raise OperationalError(f"the Spark warehouse {directory} is not a directory",
                                   hint="fix [backend.spark] warehouse in the policy")
        for entry in sorted(directory.glob("*.parquet")):
            paths[entry.name.removesuffix(".parquet").lower()] = str(entry)
    paths.update({name.lower(): path for name, path in config.tables.items()})
    return paths


def _under(location: str, root: str) -> bool:
    """Whether Spark's ``location`` (``file:/x/y``) is a directory under ``root``."""
    bare = location.removeprefix("file:") if not root.startswith("file:") else location
    return bare.startswith(root.rstrip("/") + "/")


def _key_args(sql: str) -> dict[str, Any] | None:
    """A fresh secret for the statement's ``:chorus_key`` (rewriters.dialect), if it has one."""
    return {SPARK_KEY: secrets.randbits(63)} if f":{SPARK_KEY}" in sql else None


def _sql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")
