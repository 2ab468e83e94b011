"""Bounded samples and ranked copies the proxy stores in its own schema.

Ranked copies (``ranked_copy = true``, the default with ``bounding = "per-query"``): every row
of the table's scheduled blocks with its random rank in its unit and its unit's row count, in
``chorus_private.<table>__ranked_<keyed digest>``, versioned and named like the samples below.
Per-query bounding reads it so that units with at most k rows are kept whole by a plain scan
and only heavier units' filtered rows are sorted (``rewriters.contribution.
ranked_contribution``): the same kept-row distribution as ranking every filtered row per query,
without the sort that made the default policy's queries 5-100x slower than the raw query.
Its cost is a copy of the table's scheduled rows, rebuilt when the table changes.  On DuckDB and
Postgres it has a twin, ``<copy name>_u`` (``rewriters.contribution.unit_ordered``): the same
rows sorted by the unit's row count, then unit, then stored rank, which the heavy branch of a
query over much of the schedule reads (``kinds.single``): its ranking then meets each unit's
rows one after the other (DuckDB plans it as a per-unit top-k hash aggregate, whose unit
states are then hit one at a time instead of at random: 2-3x faster on 1M trips; Postgres
sorts rows nearly sorted), and its ``__chorus_unit_rows > k`` reads only the twin's tail
(DuckDB skips the row groups of lighter units by their min/max, Postgres reads the pages of
its index on the count one after the other: a heavy branch at cap 28 over 1M demo trips took
17 instead of 35 ms on DuckDB).  On DuckDB the copy also stores each row's position in the
twin's order (``__chorus_pos``) and that of its unit's first row (``__chorus_run``,
``rewriters.contribution.ranked_table``'s ``positions``; part of the copy's name, so older
copies are rebuilt), which the heavy branch reads as it keeps each unit's first k rows in
one pass (``rewriters.contribution.streamed_rank``), and each bounded numeric column clipped
at its declared bounds (``__chorus_clip<i>``, ``rewriters.clipping.stored_clip_columns``),
which an answer reads where it clips that column at those bounds (the clip was half of a
whole-table SUM's statement).
A table whose blocks are cut on a date or timestamp column also has a month twin, ``<copy
name>_m`` (``rewriters.contribution.month_ordered``): the copy stores each row's calendar
month (``__chorus_month``), and the month twin holds the same rows by month, then in the twin's
order with its own positions, which the heavy branch of a query over one month reads instead
of every month's rows of the twin (``kinds.single.month_twin_pays``).  On Postgres the month
twin is a table partitioned by month (``partitioned_month_twin_statements``): each month's rows
sorted and indexed in the twin's order, which both branches of a query over one month read
(the copy there stores no month: each partition's is a literal).
The twin doubles the copy's storage (the month twin adds as much again; on Postgres each twin's
index covers its other columns, ``covering_index``, about a twin's size more); a Postgres table
whose twin's name would exceed 63 bytes (Postgres would truncate it) has none. Thresholded keys
over the whole copy (a top-10 of drivers) read a grouped twin per key columns, ``<copy
name>_g<digest>`` (``rewriters.grouped_copy``): the copy's rows with each unit's groups ranked
once, built in the background by the first such query, each another copy's worth of storage;
with no bound on groups per unit, its marks count each group's distinct units
(``first_kept_of_group``).

Bounded samples (``bounding = "materialized"``):

For a table with a privacy unit and cap k, the proxy keeps one random sample of at most k rows per
unit in ``chorus_private.<table>__bounded_<keyed digest>``; queries then read that sample instead
of ranking rows per query.  Stability stays k for every query (each unit has <= k rows in the
sample, chosen at random, independently of other units), and reusing one sample across queries
costs no privacy.  On DuckDB it stores each bounded numeric column clipped at its declared
bounds too, as the ranked copy does (``__chorus_clip<i>``).

The sample is versioned by a fingerprint of its source table and rebuilt when the table changes:
on Postgres the relation's oid and relfilenode (new after DROP/CREATE or TRUNCATE) with its
``pg_stat_user_tables`` counters (inserts, updates, deletes: cheap, updated by the statistics
collector within about a second); on DuckDB the row count with a hash checksum of every
column of every row (one scan; on Spark likewise).  The fingerprint is read at most once per TTL.
The sample holds only the rows of the table's scheduled blocks
(``chorus_py.stores.schedules``): a row
outside the schedule belongs to no block and takes no part in the ranking; the schedule's span is
part of the version, so the sample is rebuilt when a new block begins.

The sample's name appears in the rewritten SQL that reports show to analysts, and the counters
behind the fingerprint are exact data-derived numbers (an unkeyed hash of a small insert count
could be inverted by brute force).  So the name carries an HMAC of the fingerprint under a
random key kept in the proxy's own schema (``chorus_private.chorus_key``, created once): every
proxy sharing the database computes the same names, and an analyst, who cannot read that schema,
learns only that the data changed when the name does.
Analysts cannot reach the schema: the analyser refuses schema-qualified and undeclared tables.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from datetime import date, datetime, timedelta

from sqlglot import exp

from analyses.blocks import BlockWindows
from chorus_py.backends import SCHEMA, Backend
from chorus_py.policy import TablePolicy
from chorus_py.stores.owned import serialised
from chorus_py.stores.schedules import BlockCatalog
from mechanisms.clip_bounds import STEPS
from rewriters.bins import BINS, stored_bin_columns, stored_bins
from rewriters.blocks import (
    MONTHLY_TYPES,
    BlockRestriction,
    month_number,
    month_sql,
    month_start,
)
from rewriters.blocks import blocks as restrict_blocks
from rewriters.clipping import clips_stored, stored_clip_columns
from rewriters.contribution import (
    MONTH,
    POSITION,
    RANK,
    UNIT_ROWS,
    month_ordered,
    positions_stored,
    ranked_table,
    sample_table,
    unit_ordered,
)
from rewriters.dialect import dialect as for_dialect
from rewriters.grouped_copy import grouped_name, grouped_table
from rewriters.selection import stored_digit_columns

log = logging.getLogger("chorus.materialize")

SAMPLE = "__bounded_"  # a bounded sample's name: <table>__bounded_<digest>
RANKED = "__ranked_"   # a ranked copy's name: <table>__ranked_<digest>
#: A stored relation replaced by a newer version is dropped this long after (``_retire``).
REPLACED_GRACE_SECONDS = 600.0
#: Postgres truncates longer identifiers (NAMEDATALEN - 1): a twin's name must fit whole.
POSTGRES_NAME_BYTES = 63
#: At most this many grouped twins per ranked copy (each another copy's storage): analysts'
#: queries start their builds, so a query over yet another set of key columns must not grow
#: the proxy's schema without end; past it, queries rank their groups themselves.
MAX_GROUPED_TWINS = 4
#: A Postgres month twin has a partition per month of the schedule: at most this many (ten
#: years); a longer schedule has none (its queries read the twin or the copy).
MAX_MONTH_PARTITIONS = 120


def ranked_copy_applies(policy: TablePolicy) -> bool:
    """Whether per-query bounding of the table reads a ranked copy."""
    return (not policy.public and policy.ranked_copy and policy.privacy_unit is not None
            and not policy.multi_attribution and policy.bounding == "per-query")


def covers_whole_copy(restriction: BlockRestriction | None, windows: BlockWindows) -> bool:
    """Whether a read of a ranked copy restricted to the claimed blocks ``restriction`` keeps
    every row of the copy, for a table whose schedule spans ``windows``: one window from the
    schedule's start to its end (the copy holds the rows of the schedule when it was built,
    which only grows: every one of them is in that window)."""
    return restriction is not None and not restriction.windows \
        and restriction.start == windows.start and restriction.end == windows.end


def month_twin_statements(name: str, month_twin: str, unit: str) -> list[str]:
    """Build the month twin ``month_twin`` of the DuckDB ranked copy ``name`` (in the proxy's
    schema) from the copy itself: the same rows, ranks, unit counts and months, sorted by
    month, then as the twin (unit row count, unit, stored rank), its positions renumbered in
    that order (``streamed_rank`` checks them as the heavy branch reads one month, whose rows
    come in the twin's order within it).  Each unit keeps its run number (the twin's
    position of its first row: one number per unit, as in the copy)."""
    order = f'"{MONTH}", "{UNIT_ROWS}", "{unit}" NULLS LAST, "{RANK}"'
    return [f'CREATE TABLE IF NOT EXISTS {SCHEMA}."{month_twin}" AS SELECT * FROM (SELECT * '
            f'REPLACE (ROW_NUMBER() OVER (ORDER BY {order}) AS "{POSITION}") FROM '
            f'{SCHEMA}."{name}") AS s ORDER BY "{POSITION}"']


def partitioned_month_twin_statements(name: str, month_twin: str, unit: str, block: str,
                                      block_type: str, span: BlockWindows) -> list[str]:
    """Build the month twin ``month_twin`` of the Postgres ranked copy ``name`` (in the proxy's
    schema): a table partitioned by ``__chorus_month``, one partition per calendar month of the
    schedule's ``span``, each the copy's rows of that month (read by the copy's index on the
    block column ``block``) sorted as the twin (unit row count, unit, stored rank) and indexed
    in that order.  A query over one month names its month as a literal, so the planner reads
    that partition alone, with its own statistics: the heavy branch's window then runs over
    the partition's index already in its order (no sort), the light branch reads the index's
    first units (``__chorus_unit_rows <= k``, a few pages).  One table of all months sorted
    the same way was not enough: the planner, multiplying the selectivities of the month and
    of the query's time filter (the same rows), expected a third of them and sorted instead.

    Each partition is built as a table of its own, then attached (re-running the statements
    after another proxy ran them adds nothing: every ``CREATE`` is ``IF NOT EXISTS``, and a
    partition already attached is left as it is).  The copy holds only the span's rows, so
    the partitions hold every row of it, each in the month it lies in.  Vacuumed once built
    (``Backend.settle_owned``), for the index-only scans of its covering index."""
    copy, parent = f'{SCHEMA}."{name}"', f'{SCHEMA}."{month_twin}"'
    statements = [f'CREATE TABLE IF NOT EXISTS {parent} (LIKE {copy}, "{MONTH}" INT) '
                  f'PARTITION BY LIST ("{MONTH}")']
    column = exp.column(block, table="c", quoted=True)
    for month in span_months(span):
        part = f'{SCHEMA}."{month_partition(month_twin, month)}"'
        start = max(span.start, _month_point(month, span.start))
        end = min(span.end, _month_point(month + 1, span.start))
        where = restrict_blocks(None, column, start, end, block_type).sql("postgres")
        statements += [
            f'CREATE TABLE IF NOT EXISTS {part} AS SELECT c.*, CAST({month} AS INT) '
            f'AS "{MONTH}" FROM {copy} AS c WHERE {where} ORDER BY "{UNIT_ROWS}", "{unit}", '
            f'"{RANK}"',
            "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_inherits WHERE inhrelid = "
            f"'{part}'::regclass) THEN ALTER TABLE {parent} ATTACH PARTITION {part} "
            f"FOR VALUES IN ({month}); END IF; END $$"]
    # On the parent: one index per partition, in the order of the twin's, covering its other
    # columns (``covering_index``; its name is Postgres's, made from the partition's).
    statements += [covering_index(month_twin, unit), f"ANALYZE {parent}"]
    return statements


def covering_index(twin: str, unit: str) -> str:
    """The Postgres statement that indexes the twin ``twin`` (in the proxy's schema: the twin
    in unit order, or the month twin, whose partitions each get one) in its order, (unit row
    count, ``unit``, stored rank), covering every other column of it.

    The heavy branch then reads its units by an index-only scan: every column a query's filter
    or aggregates name is in the index, in the order its window numbers the rows, and no heap
    page is read once a VACUUM has marked them all visible (``Backend.settle_owned``).  On 1M
    demo trips, the heavy branch of ``AVG(distance_km) WHERE fare BETWEEN 10 AND 20`` at cap 3
    (455,435 rows of 921,609 read) took 225-251 ms against 308-310 by the index on the order
    alone, and the whole answer 369 -> 293 ms with the light branch from the twin
    (``kinds.single.light_twin_pays``); over the month twin, by-city AVG of January 215 ->
    202 ms, VARIANCE of March 230 -> 207, a filtered AVG of February 128 -> 109 (medians of
    7).  The index is about the twin's size (90 MB for the 1M demo trips).
    A B-tree entry holds at most about 2.7 kB and an index 32 columns: for a table with a
    longer row (a long text value) or more columns, the index on the order alone, as before.
    The twin's columns are read from the catalog when the statement runs, in the same
    transaction as the twin's creation.

    >>> print(covering_index("t__ranked_x_u", "rider_id"))  # doctest: +NORMALIZE_WHITESPACE
    DO $chorus$ DECLARE included TEXT; BEGIN SELECT string_agg(quote_ident(attname), ', '
    ORDER BY attnum) INTO included FROM pg_attribute WHERE attrelid =
    'chorus_private."t__ranked_x_u"'::regclass AND attnum > 0 AND NOT attisdropped AND NOT
    attname IN ('__chorus_unit_rows', 'rider_id', '__chorus_rank'); EXECUTE format('CREATE
    INDEX IF NOT EXISTS %I ON chorus_private.%I (%I, %I, %I) INCLUDE (%s)',
    't__ranked_x_u_cover', 't__ranked_x_u', '__chorus_unit_rows', 'rider_id', '__chorus_rank',
    included); EXCEPTION WHEN program_limit_exceeded OR too_many_columns THEN EXECUTE
    format('CREATE INDEX IF NOT EXISTS %I ON chorus_private.%I (%I, %I, %I)',
    't__ranked_x_u_order', 't__ranked_x_u', '__chorus_unit_rows', 'rider_id',
    '__chorus_rank'); END $chorus$
    """
    def literal(text: str) -> str:  # names as string literals: format's %I quotes them
        return exp.Literal.string(text).sql("postgres")

    keys = ", ".join(literal(k) for k in (UNIT_ROWS, unit, RANK))
    table, qualified = literal(twin), literal(f'{SCHEMA}."{twin}"')
    return ("DO $chorus$ DECLARE included TEXT; BEGIN "
            "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO included "
            f"FROM pg_attribute WHERE attrelid = {qualified}::regclass "
            f"AND attnum > 0 AND NOT attisdropped AND NOT attname IN ({keys}); "
            f"EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON {SCHEMA}.%I (%I, %I, %I) "
            f"INCLUDE (%s)', {literal(f'{twin}_cover')}, {table}, {keys}, included); "
            "EXCEPTION WHEN program_limit_exceeded OR too_many_columns THEN "
            f"EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON {SCHEMA}.%I (%I, %I, %I)', "
            f"{literal(f'{twin}_order')}, {table}, {keys}); END $chorus$")


def span_months(span: BlockWindows) -> range:
    """The calendar months (``rewriters.blocks.month_number``) a schedule's span [start, end)
    has instants in.

    >>> from datetime import date
    >>> span_months(BlockWindows("t", date(2026, 1, 1), timedelta(days=1), 90))
    range(672, 675)
    >>> span_months(BlockWindows("t", datetime(2026, 1, 31), timedelta(days=1), 1))
    range(672, 673)
    """
    last = span.end - (timedelta(days=1) if type(span.end) is date else timedelta(microseconds=1))
    return range(month_number(span.start), month_number(last) + 1)


def month_partition(month_twin: str, month: int) -> str:
    """The name of the partition of the Postgres month twin ``month_twin`` holding ``month``."""
    return f"{month_twin}_{month}"


def _monthly_blocks(policy: TablePolicy) -> bool:
    """Whether the table's blocks are cut on a date or timestamp column (whose rows fall in
    calendar months)."""
    block = policy.block
    return block is not None and policy.columns[block.column].type in MONTHLY_TYPES


def _month_point(month: int, like: datetime | date) -> datetime | date:
    """The first instant of ``month`` as a value of ``like``'s type (a schedule's bounds are
    dates or datetimes: they compare only with their own kind)."""
    start = month_start(month)
    return start.date() if type(like) is date else start


class BoundedSamples:
    """Keeps one up-to-date bounded sample per table (thread-safe)."""

    #: Ranked copies are built in a background thread (queries never wait for one); the test
    #: suite builds them in the query that needs one, so every statement it sees is the same.
    build_in_background = True

    def __init__(self, backend: Backend, ttl_seconds: float = 60.0,
                 blocks: BlockCatalog | None = None, build_ranked_copies: bool = True) -> None:
        self._backend = backend
        self._ttl = ttl_seconds
        self._blocks = blocks or BlockCatalog()
        self._current: dict[tuple[str, str], tuple[float, str | None]] = {}
        self._lock = threading.Lock()
        self._key: bytes | None = None  # names the samples; see the module docstring
        self._building: dict[str, threading.Thread] = {}  # ranked copies being built
        # False for one-shot commands (chorus query): they read a current copy a server built,
        # but never start a build they would have to wait for at exit.
        self._build_ranked_copies = build_ranked_copies
        self._twins: set[str] = set()  # ranked copies whose unit-ordered twin is there
        self._month_twins: set[str] = set()  # and those whose month twin is there
        # Grouped twins: True when there, a thread while built, a time when a build failed.
        self._grouped: dict[str, bool | threading.Thread | float] = {}
        # Each twin's middle stored count (``middle``), read once: None when that failed.
        self._middles: dict[str, int | None] = {}
        #: Whether queries may read the twins (benchmarks.unit_order compares both paths).
        self.read_twins = True
        #: Whether queries over one month may read the month twins (benchmarks.month_twin).
        self.read_month_twins = True
        #: Whether queries may read the grouped twins (benchmarks.grouped_twin, likewise).
        self.read_grouped_twins = True

    def relation(self, table: str, policy: TablePolicy) -> str:
        """The name (``chorus_private.x``) of the current sample of ``table``."""
        return self._current_name(table, policy, SAMPLE)

    def ranked_relation(self, table: str, policy: TablePolicy) -> tuple[str, str] | None:
        """(schema, name) of the ranked copy that per-query bounding of ``table`` reads: None
        when the policy gives it none (``ranked_copy_applies``) or while it is being built
        (:meth:`ranked`: the query then ranks its rows itself, the same answers, slower)."""
        if not ranked_copy_applies(policy):
            return None
        found = self.ranked(table, policy)
        return None if found is None else (SCHEMA, found)

    def ranked(self, table: str, policy: TablePolicy) -> str | None:
        """The name of the current ranked copy of ``table``: all its scheduled rows, each with
        its random rank in its unit and its unit's row count (``rewriters.contribution.
        ranked_table``), which per-query bounding reads so that it need not rank the rows of
        units with at most k rows (``ranked_contribution``).

        None while there is no copy of the table's current version: the first call, and the
        first after the table changed, start building one in the background, and queries rank
        their rows themselves until it is there (the same answers, slower), so no query waits
        for a build.  None also when building fails (e.g. a role that may not write the
        proxy's schema), logged, and retried after the TTL.
        """
        now = time.monotonic()
        with self._lock:
            hit = self._current.get((table, RANKED))
            if hit is not None and now - hit[0] < self._ttl:
                return hit[1]
            if table in self._building:
                return None
            try:
                name, span = self._version(table, policy, RANKED)
            except Exception as err:
                self._ranked_failed(table, err)
                return None
            if hit is not None and hit[1] == name:  # unchanged: still current
                self._current[(table, RANKED)] = (now, name)
                return name
            # Changed (or never built): the old copy no longer matches the table.
            self._current.pop((table, RANKED), None)
            if not self._build_ranked_copies:  # a one-shot command: use one if it is there
                # The backend's own listing: Spark has no information_schema.
                owned = self._backend.owned_tables()
                there = name in owned
                if there and unit_ordered(name) in owned and self._has_twin(name):
                    self._twins.add(name)
                if there and month_ordered(name) in owned \
                        and self._has_month_twin(name, policy, span):
                    self._month_twins.add(name)
                self._current[(table, RANKED)] = (now, name if there else None)
                return name if there else None
            if not self.build_in_background:  # built now, read by this very query
                try:
                    self._build(table, policy, name, span, RANKED)
                except Exception as err:
                    self._ranked_failed(table, err)
                    return None
                self._current[(table, RANKED)] = (now, name)
                return name
            self._building[table] = threading.Thread(
                target=self._build_ranked, args=(table, policy, name, span),
                name=f"chorus-ranked-{table}", daemon=True)
            self._building[table].start()
            return None

    def twin(self, copy: str) -> bool:
        """Whether the ranked copy named ``copy`` has its twin in unit order
        (``rewriters.contribution.unit_ordered``) for queries to read."""
        with self._lock:
            return self.read_twins and copy in self._twins

    def middle(self, copy: str) -> int | None:
        """The stored row count ``__chorus_unit_rows`` of the middle row of ``copy``'s twin in
        unit order (sorted by that count first): the cut K that splits the choices' cells of
        a query reading the twin into two parts of about half its rows each
        (``rewriters.selection.choice_histogram``'s ``part``), which Postgres runs side by
        side.  Read with the copy, when this proxy builds or first finds it
        (``_read_middle``), never by a query.  None without a twin, elsewhere, in a one-shot
        command, or when the read failed: the cells then run whole, the same cells.  Only the
        parts' running time depends on it: their cells add up to the whole statement's
        whatever K is."""
        with self._lock:
            return self._middles.get(copy) if self.read_twins and copy in self._twins else None

    def _read_middle(self, copy: str) -> int | None:
        """``middle`` of ``copy``, read from its twin's index on Postgres (90 ms for 1M demo
        trips, once: the twin never changes under its name); None elsewhere or on failure
        (logged)."""
        if self._backend.dialect != "postgres":
            return None
        twin = f'{SCHEMA}."{unit_ordered(copy)}"'
        try:
            rows = self._backend.run(
                f"SELECT {UNIT_ROWS} FROM {twin} ORDER BY {UNIT_ROWS} LIMIT 1 "
                f"OFFSET (SELECT COUNT(*) / 2 FROM {twin})").rows
        except Exception as err:
            log.warning("the middle of %s not read (%s): its cells run whole", twin,
                        str(err).splitlines()[0] if str(err) else type(err).__name__)
            return None
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    def month_twin(self, copy: str) -> bool:
        """Whether the ranked copy named ``copy`` has its month twin
        (``rewriters.contribution.month_ordered``) for queries to read."""
        with self._lock:
            return self.read_twins and self.read_month_twins and copy in self._month_twins

    def grouped(self, copy: str, unit: str, columns: tuple[str, ...], block: str | None
                ) -> str | None:
        """The name of the grouped twin of the ranked copy ``copy`` over the key ``columns``
        (``rewriters.grouped_copy``), or None while it is being built (the first call starts
        the build in the background; queries take the per-query path meanwhile, the same
        answers), after a failed build (retried after the TTL), on Spark, and on Postgres
        when its name would be truncated.  ``block``: the block column it is stored in the
        order of (None: none), so that DuckDB skips row groups of unclaimed blocks."""
        name = grouped_name(copy, columns)
        dialect = self._backend.dialect
        if not self.read_grouped_twins or dialect not in ("duckdb", "postgres") or (
                dialect == "postgres" and len(name.encode()) > POSTGRES_NAME_BYTES):
            return None
        now = time.monotonic()
        with self._lock:
            state = self._grouped.get(name)
            if state is True:
                return name
            if isinstance(state, threading.Thread) or (
                    isinstance(state, float) and now - state < self._ttl):
                return None
            if state is None and self._grouped_of(copy, building=True) >= MAX_GROUPED_TWINS:
                return None
            if not self._build_ranked_copies:  # a one-shot command: use one if it is there
                there = name in self._backend.owned_tables()
                self._grouped[name] = True if there else now
                return name if there else None
            thread = threading.Thread(target=self._build_grouped,
                                      args=(copy, unit, columns, block, name),
                                      name=f"chorus-grouped-{copy}", daemon=True)
            self._grouped[name] = thread
            if self.build_in_background:
                thread.start()
                return None
        # Built now (the test suite), read by this very query; outside the lock, which the
        # build takes to record its state.
        thread.start()
        thread.join()
        with self._lock:
            return name if self._grouped.get(name) is True else None

    def grouped_built(self, copy: str) -> int:
        """How many grouped twins of the ranked copy ``copy`` queries may read (-1: none may,
        ``read_grouped_twins`` is off): a plan made before one was built is made again."""
        with self._lock:
            return self._grouped_of(copy, building=False) if self.read_grouped_twins else -1

    def _grouped_of(self, copy: str, building: bool) -> int:
        """How many grouped twins of ``copy`` are built (``building``: or being built); the
        caller holds the lock."""
        return sum(1 for name, state in self._grouped.items() if name.startswith(copy)
                   and (state is True or (building and isinstance(state, threading.Thread))))

    def _build_grouped(self, copy: str, unit: str, columns: tuple[str, ...],
                       block: str | None, name: str) -> None:
        """Build the grouped twin ``name`` (``grouped``); records its state."""
        started = time.perf_counter()
        select = grouped_table(SCHEMA, copy, unit, columns)
        if block is not None:
            select = exp.select("*").from_(select.subquery("g"), copy=False).order_by(
                exp.column(block, quoted=True), copy=False)
        dialect = self._backend.dialect
        statements = [f'CREATE TABLE IF NOT EXISTS {SCHEMA}."{name}" AS '
                      f'{for_dialect(select, dialect, copy=False).sql(dialect)}']
        if dialect == "postgres":
            statements.append(f'ANALYZE {SCHEMA}."{name}"')
        try:
            self._backend.run_owned(serialised(dialect, statements))
        except Exception as err:
            with self._lock:
                self._grouped[name] = time.monotonic()  # retried after the TTL
            log.warning("no grouped twin %s of %s (%s): thresholded keys rank each unit's "
                        "groups per query", name, copy,
                        str(err).splitlines()[0] if str(err) else type(err).__name__)
            return
        with self._lock:
            self._grouped[name] = True
        log.info("grouped twin of %s over %s built as %s.%s in %.0f ms", copy,
                 ", ".join(columns), SCHEMA, name, (time.perf_counter() - started) * 1000)

    def _settle(self, tables: list[str]) -> None:
        """``Backend.settle_owned`` for tables just built (one connection for all); a failure
        (another proxy dropped one meanwhile) only leaves them slower to read."""
        try:
            self._backend.settle_owned(tables)
        except Exception as err:
            log.warning("%s not vacuumed (%s): their index-only scans read heap pages until "
                        "autovacuum passes", ", ".join(f"{SCHEMA}.{t}" for t in tables),
                        str(err).splitlines()[0] if str(err) else type(err).__name__)

    def _has_twin(self, name: str) -> bool:
        """Whether the ranked copy ``name`` gets a twin on this backend: not on
        Spark (its tables have no row order to speak of), nor on Postgres when the twin's name
        would be truncated."""
        dialect = self._backend.dialect
        return dialect == "duckdb" or (
            dialect == "postgres"
            and len(unit_ordered(name).encode()) <= POSTGRES_NAME_BYTES)

    def _months_stored(self, policy: TablePolicy) -> bool:
        """Whether the table's ranked copies store each row's calendar month (``__chorus_month``,
        ``rewriters.blocks.month_sql``) for a month twin: on DuckDB, when the table's blocks
        are cut on a date or timestamp column.  Postgres's month twin is partitioned by month,
        each partition built from the copy's rows of its month (read by the copy's block
        index) with the month as a literal: its copy stores none."""
        return self._backend.dialect == "duckdb" and _monthly_blocks(policy)

    def _has_month_twin(self, name: str, policy: TablePolicy, span: BlockWindows | None
                        ) -> bool:
        """Whether the ranked copy ``name`` also gets a month twin: where it gets a twin
        (``_has_twin``: its name is as long) and, on DuckDB, stores its rows' months; on
        Postgres, where its table's blocks are cut on a date or timestamp column, the schedule
        (``span``, when known) has at most ``MAX_MONTH_PARTITIONS`` months, and the name of
        each month's partition fits (``partitioned_month_twin_statements``)."""
        if self._backend.dialect != "postgres":
            return self._has_twin(name) and self._months_stored(policy)
        if not _monthly_blocks(policy) or span is None or not self._has_twin(name):
            return False
        months = span_months(span)
        return 0 < len(months) <= MAX_MONTH_PARTITIONS and len(month_partition(
            month_ordered(name), months[-1]).encode()) <= POSTGRES_NAME_BYTES

    def wait(self) -> None:
        """Wait for the ranked copies (and grouped twins) being built (``chorus serve`` at
        start, tests, benchmarks)."""
        while True:
            with self._lock:
                threads = [*self._building.values(),
                           *[t for t in self._grouped.values() if isinstance(t, threading.Thread)]]
            if not threads:
                return
            for thread in threads:
                thread.join()

    def _build_ranked(self, table: str, policy: TablePolicy, name: str,
                      span: BlockWindows | None) -> None:
        try:
            self._build(table, policy, name, span, RANKED)
        except Exception as err:
            with self._lock:
                self._building.pop(table, None)
                self._ranked_failed(table, err)
            return
        with self._lock:
            self._building.pop(table, None)
            self._current[(table, RANKED)] = (time.monotonic(), name)

    def _ranked_failed(self, table: str, err: Exception) -> None:
        """Remember (for the TTL) that ``table`` has no ranked copy; the caller holds the lock."""
        self._current[(table, RANKED)] = (time.monotonic(), None)
        log.warning("no ranked copy of %s (%s): per-query bounding ranks every filtered row; "
                    "let the proxy's role write its schema %s, or set ranked_copy = false",
                    table, str(err).splitlines()[0] if str(err) else type(err).__name__,
                    SCHEMA)

    def _version(self, table: str, policy: TablePolicy, kind: str
                 ) -> tuple[str, BlockWindows | None]:
        """The name of ``table``'s stored relation of ``kind`` for its current version (and
        layout: a ranked copy with positions is another relation than one without)."""
        span = self._span(table, policy)
        layout = "|runs" if kind == RANKED and positions_stored(self._backend.dialect) else ""
        if kind == RANKED and self._months_stored(policy):
            layout += "|month"  # the copy stores each row's month (__chorus_month)
        digest = hmac.new(self._naming_key(),
                          f"{self._fingerprint(table, policy, kind)}|{span}{layout}".encode(),
                          hashlib.sha256).hexdigest()[:16]
        return f"{table}{kind}{digest}", span

    def _current_name(self, table: str, policy: TablePolicy, kind: str) -> str:
        now = time.monotonic()
        with self._lock:
            hit = self._current.get((table, kind))
            if hit is not None and now - hit[0] < self._ttl and hit[1] is not None:
                return hit[1]
            name, span = self._version(table, policy, kind)
            if hit is None or hit[1] != name:
                self._build(table, policy, name, span, kind)
            self._current[(table, kind)] = (now, name)
            return name

    def naming_key(self) -> bytes:
        """The proxy's secret key; it also names ``chorus_py.stores.attribution``'s kept sets."""
        return self._naming_key()

    def _naming_key(self) -> bytes:
        """The shared secret key of the proxy's schema, created by the first proxy to need it."""
        if self._key is None:
            # Two proxies racing here: the lock orders them, and the primary key keeps the
            # first key only.  (Spark keeps it in a file of its private directory instead.)
            self._key = self._backend.owned_key(serialised(self._backend.dialect, [
                f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
                f"CREATE TABLE IF NOT EXISTS {SCHEMA}.chorus_key (id INTEGER PRIMARY KEY, "
                "k TEXT NOT NULL)",
                f"INSERT INTO {SCHEMA}.chorus_key VALUES (1, '{secrets.token_hex(32)}') "
                "ON CONFLICT DO NOTHING",
            ]))
        return self._key

    def _fingerprint(self, table: str, policy: TablePolicy, kind: str) -> str:
        assert policy.privacy_unit is not None
        if self._backend.dialect == "postgres":
            # The relation's identity with its change counters: a table dropped and created
            # again (or truncated) with as many rows has the same counters but a new oid or
            # relfilenode, so it never reuses the old relation's copy.
            row = self._backend.run(
                "SELECT c.oid, c.relfilenode, s.n_tup_ins, s.n_tup_upd, s.n_tup_del "
                "FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
                "LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid "
                f"WHERE n.nspname = current_schema() AND c.relname = '{table}'").rows
        elif self._backend.dialect == "duckdb":
            # Every column of every row (the stored rows carry the values, not only the units
            # and blocks): an UPDATE of a value column is a new version too.
            row = self._backend.run(
                f'SELECT COUNT(*), SUM(hash(t) % 1000000007) FROM "{table}" AS t').rows
        else:  # Spark: every column of every row too (hash(*) expands to them)
            row = self._backend.run(
                f'SELECT COUNT(*), SUM(hash(*) % 1000000007) FROM "{table}"').rows
        # "clips": it stores the bounded columns clipped at their declared bounds
        # (rewriters.clipping.stored_clip_columns).
        clips = f"|clips {stored_bins(policy)}" if clips_stored(self._backend.dialect) else ""
        if kind == RANKED:  # every row, whatever the cap: engines of any k share it
            # and the bins it stores (rewriters.bins): other declared bounds, another copy;
            # "order": its twin's index is in the twin's order (a copy whose twin was indexed
            # on the row count alone is built again, with it); "digits": it stores the
            # magnitude digits of the choices' cells (rewriters.selection.stored_digit_columns,
            # over the same columns and bounds, STEPS + 1 edges each).
            return (f"{row}|{policy.privacy_unit}|ranked|bins {BINS} {stored_bins(policy)}"
                    f"|order|digits {STEPS}{clips}")
        # The cap is part of the version: a new max_rows_per_unit needs a new sample; so is
        # its layout ("ordered": in block order, indexed), so that older samples are rebuilt;
        # and its clipped values' columns and bounds.
        return f"{row}|{policy.privacy_unit}|{policy.contribution_bound}|ordered{clips}"

    def _span(self, table: str, policy: TablePolicy) -> BlockWindows | None:
        """The table's scheduled windows now (None: no blocks): the sample holds only their
        rows, so rows outside the schedule never take part in the ranking."""
        return None if policy.block is None else self._blocks.windows(table, policy.block)

    def _retire(self, stale: list[str]) -> None:
        """Drop the replaced relations ``stale`` once they have been replaced for longer than
        the grace period; mark the others.  Another proxy sharing the database may read a
        relation it found current up to its TTL ago: dropping it at once would fail that
        proxy's query (the copies of a table with changing rows are replaced often)."""
        if not stale:
            return
        if self._backend.dialect == "spark":
            # A local Spark's private directory belongs to this process alone: no other proxy
            # can be reading the replaced relations (and Spark has no INSERT ... ON CONFLICT).
            self._backend.run_owned([f'DROP TABLE IF EXISTS {SCHEMA}."{n}"' for n in stale])
            return
        registry = f"{SCHEMA}.chorus_replaced"
        now = time.time()  # wall clock: shared by the proxies on several machines
        self._backend.run_owned(serialised(self._backend.dialect, [
            f"CREATE TABLE IF NOT EXISTS {registry} (name TEXT PRIMARY KEY, "
            "since DOUBLE PRECISION NOT NULL)",
            *[f"INSERT INTO {registry} VALUES ('{n}', {now!r}) ON CONFLICT DO NOTHING"
              for n in stale]]))
        listed = ", ".join(f"'{n}'" for n in stale)
        expired = [r[0] for r in self._backend.run(
            f"SELECT name FROM {registry} WHERE name IN ({listed}) "
            f"AND since < {now - self._grace()!r}").rows]
        if expired:
            self._backend.run_owned(serialised(
                self._backend.dialect,
                [f'DROP TABLE IF EXISTS {SCHEMA}."{n}"' for n in expired]
                + [f"DELETE FROM {registry} WHERE name IN "
                   f"({', '.join(repr(n) for n in expired)})"]))

    def _grace(self) -> float:
        """How long a replaced relation is kept: well beyond any proxy's TTL and a query."""
        return max(REPLACED_GRACE_SECONDS, 3 * self._ttl)

    def _build(self, table: str, policy: TablePolicy, name: str,
               span: BlockWindows | None, kind: str) -> None:
        assert policy.privacy_unit is not None
        started = time.perf_counter()
        where = None
        if span is not None:
            assert policy.block is not None
            where = restrict_blocks(None, exp.column(policy.block.column, table="t",
                                                     quoted=True),
                                    span.start, span.end,
                                    policy.columns[policy.block.column].type)
        clips = stored_clip_columns(policy, "t") if clips_stored(self._backend.dialect) else []
        if kind == RANKED:
            # DuckDB's heavy branch checks the twin's order by the stored positions
            # (``rewriters.contribution.streamed_rank``).
            positions = positions_stored(self._backend.dialect)
            months = None
            if self._months_stored(policy):
                assert policy.block is not None
                months = month_sql(exp.column(policy.block.column, table="t", quoted=True))
            select = ranked_table(table, policy.privacy_unit, where,
                                  [*stored_bin_columns(policy, "t"),
                                   *stored_digit_columns(policy, "t"), *clips],
                                  positions=positions, month=months)
        else:
            select = sample_table(table, policy.privacy_unit, policy.contribution_bound, where,
                                  clips)
        existing = [(t,) for t in self._backend.owned_tables() if t.startswith(f"{table}{kind}")]
        statements = [f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"]
        twin = unit_ordered(name) if kind == RANKED and self._has_twin(name) else None
        month_twin = month_ordered(name) if kind == RANKED \
            and self._has_month_twin(name, policy, span) else None
        if not any(r[0] == name for r in existing):
            dialect = self._backend.dialect
            if policy.block is not None:
                # Every query filters on its blocks' windows of the block column: rows stored in
                # that order let DuckDB skip row groups (zone maps) and, with an index, Postgres
                # read only the blocks a query asks for (a query over the last days of a
                # quarter no longer scans it all).
                select = exp.select("*").from_(select.subquery("s")).order_by(
                    exp.column(policy.block.column, quoted=True))
            # IF NOT EXISTS: another proxy sharing the database may have built it since we
            # looked (chorus_py.stores.owned orders the two batches); it is the same relation,
            # as its name says (the same key, fingerprint and span).  Named indexes, so that
            # the second batch does not add a second copy of each.  (On Spark the random ranks
            # become a keyed hash: rewriters.dialect.)
            rendered = for_dialect(select, dialect, copy=False).sql(dialect)
            statements.append(f'CREATE TABLE IF NOT EXISTS {SCHEMA}."{name}" AS {rendered}')
            if dialect == "postgres":
                if policy.block is not None:
                    statements.append(f'CREATE INDEX IF NOT EXISTS "{name}_block" ON '
                                      f'{SCHEMA}."{name}" ("{policy.block.column}")')
                if kind == RANKED:  # the heavy branch reads only units above k: few rows
                    statements.append(f'CREATE INDEX IF NOT EXISTS "{name}_rows" ON '
                                      f'{SCHEMA}."{name}" ("{UNIT_ROWS}")')
                # Without statistics the planner guesses ~1000 rows and picks sort-based plans.
                statements.append(f'ANALYZE {SCHEMA}."{name}"')
        new_twin = twin is not None and not any(r[0] == twin for r in existing)
        if new_twin:
            # Built from the copy itself (not drawn again): the same rows, ranks and unit
            # counts, in the order the heavy branch's window ranks them, the units by their
            # row counts (a unit's rows share it: each unit's rows stay together, and the
            # units above a cap k are the twin's tail).  Also added to a copy an older proxy
            # built without one.
            order = f'"{POSITION}"' if positions_stored(self._backend.dialect) else \
                f'"{UNIT_ROWS}", "{policy.privacy_unit}", "{RANK}"'
            statements.append(
                f'CREATE TABLE IF NOT EXISTS {SCHEMA}."{twin}" AS SELECT * FROM '
                f'{SCHEMA}."{name}" ORDER BY {order}')
            if self._backend.dialect == "postgres":
                # In the twin's own order: the heavy branch reads only units above k, often
                # none (a COUNT at cap 200 over 1M demo trips scanned the whole twin, 73 of
                # its 177 ms, for no row), and reads them already in the order of its window
                # partitioned by (row count, unit) and ordered by rank
                # (``rewriters.contribution.presorted_pays``): no sort.
                # The index covers the twin's other columns (``covering_index``): the heavy
                # branch reads no heap page once the twin is vacuumed (below).
                statements.append(covering_index(twin, policy.privacy_unit))
                statements.append(f'ANALYZE {SCHEMA}."{twin}"')
        new_month_twin = month_twin is not None \
            and not any(r[0] == month_twin for r in existing)
        if new_month_twin:
            if self._backend.dialect == "postgres":
                assert policy.block is not None and span is not None
                statements += partitioned_month_twin_statements(
                    name, month_twin, policy.privacy_unit, policy.block.column,
                    policy.columns[policy.block.column].type, span)
            else:
                statements += month_twin_statements(name, month_twin, policy.privacy_unit)
        self._backend.run_owned(serialised(self._backend.dialect, statements))
        built = [t for t, new in ((twin, new_twin), (month_twin, new_month_twin)) if new]
        if built:
            self._settle(built)
        if twin is not None:
            self._twins.add(name)
            # Read with the copy, never by a query (``middle``).
            if name not in self._middles:
                self._middles[name] = self._read_middle(name)
        if month_twin is not None:
            self._month_twins.add(name)
        # The copy's twins (``_u``, grouped ``_g...``) start with its name: kept with it.
        self._retire([r[0] for r in existing if not r[0].startswith(name)])
        log.info("%s of %s rebuilt as %s.%s in %.0f ms",
                 "ranked copy" if kind == RANKED else "bounded sample", table, SCHEMA, name,
                 (time.perf_counter() - started) * 1000)
