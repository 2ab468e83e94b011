"""Every statement derived from analyst SQL reaches the backend through :class:`Statements`.

It holds the walls of DESIGN.md section 11 that concern statements, in one place:

- wall 4, the outgoing check (``analyses.outgoing``): a statement that reads a private table
  outside the bounding-and-noise structure never runs (:meth:`Statements.verify_outgoing`);
- wall 6, charge before touching: the database plans (EXPLAIN) every statement of a query
  before its claim, so one that cannot plan is refused free (:meth:`Statements.check_plans`),
  and a claim is refunded only while no statement of the query read a row (:class:`QueryRun`,
  :meth:`Statements.run`); an error message never quotes the database's, which may hold data;
- wall 5, least privilege: public-only statements run on the restricted connection.

Verdicts ("verified", "plans fine", constants) are kept per statement text: the text of a query
shape is the same on every call, so each check costs its round trip once per shape.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

import duckdb
import numpy as np

from analyses.outgoing import (
    OutgoingRules,
    Release,
    cap_bounds,
    check_outgoing,
    literal_shape,
    tokens,
)
from budget.ledger import Claim, Ledger
from chorus_py.backends import Backend, ResultSet, StatementFailed
from chorus_py.caches import LRU, WeightedLRU
from chorus_py.errors import BackendError, InternalError, QueryRefused, StatementCanceled
from rewriters.contribution import STREAM_ORDER_ERROR

log = logging.getLogger("chorus.engine")
T = TypeVar("T")

# The most bytes of derived values ``Statements.run_remembered`` keeps: a quantile histogram of
# one group is 10,000 float64 bins (80 kB), a selection's marginals about 1 kB; 64 MiB hold
# some 800 group histograms.
REMEMBERED_BYTES = 64 << 20


class QueryRun:
    """One query's trip to the database, as Wall 6 needs it (DESIGN.md section 11): the claim
    it paid and whether any of its statements may have read a row.

    A claim is consumed when granted, before any statement runs.  It is given back only while
    no statement of the query touched data: once one did (a selection histogram included),
    every later failure keeps the whole charge.  :meth:`Statements.run` consults this object
    before any refund; it is the only place a claim is refunded.
    """

    def __init__(self, claim: Claim | None,
                 durable: Callable[[], None] | None = None) -> None:
        self.claim = claim
        self.touched = False
        self.refunded = False
        # ``Ledger.claim_overlapped``: the claim's commit may still be running.
        self._durable = durable
        self._unrecorded: BaseException | None = None

    def settle(self) -> None:
        """Wait until the claim's charge is on disk; raises when it was not recorded, and
        then nothing of the query (answer, data-dependent error, refund) may leave."""
        if self._durable is not None:
            durable, self._durable = self._durable, None
            try:
                durable()
            except BaseException as err:
                self._unrecorded = err
        if self._unrecorded is not None:
            raise self._unrecorded

    def read(self) -> None:
        """A statement of the query ran to the end: it read rows."""
        self.touched = True

    def failed(self, touched_data: bool) -> None:
        """A statement failed; ``touched_data``: the backend could not rule out that it read."""
        self.touched = self.touched or touched_data

    def refund_if_untouched(self, ledger: Ledger) -> bool:
        """Refund the claim if nothing of this query read a row; whether it was refunded."""
        if self.claim is None or self.touched or self.refunded:
            return False
        self.settle()  # a claim is refunded once its charge is recorded
        ledger.refund(self.claim)  # consumed on grant: give it back
        self.refunded = True
        return True


class Statements:
    """The backend as the kinds of query use it: checked, planned, run, refunded by the rules
    above.  ``outgoing``: the policy's rules for the outgoing check."""

    def __init__(self, backend: Backend, ledger: Ledger, dialect: str,
                 outgoing: OutgoingRules) -> None:
        self.backend = backend
        self.ledger = ledger
        self.dialect = dialect
        self.outgoing = outgoing
        # Statements the outgoing check passed (wall 4), by a digest of their text.
        self._verified: LRU[tuple[object, ...], bool] = LRU(4096)
        # Statements that passed, by their literal shape (analyses.outgoing.literal_shape): a
        # text that is the same but for literal values no rule reads passes alike.
        self._shapes: LRU[tuple[object, ...], bool] = LRU(4096)
        # Statement texts the database planned without error (check_plans).
        self._planned: LRU[object, bool] = LRU(4096)
        self._constants: LRU[str, bool] = LRU(4096)  # verdicts of run_constant
        # Exact results of statements over stored relations only (run_stored), by their text.
        self._stored: LRU[str, ResultSet] = LRU(256)
        # What run_stored_as derived from them: (the result it came from, the value).
        self._derived: LRU[tuple[str, Hashable], tuple[ResultSet, Any]] = LRU(256)
        # What run_remembered derived, without the result it came from: (the value,).
        self._remembered: WeightedLRU[tuple[str, Hashable], tuple[Any]] = \
            WeightedLRU(REMEMBERED_BYTES)
        self._scratch: duckdb.DuckDBPyConnection | None = None  # opened on first proxy noise
        self._scratch_lock = threading.Lock()

    def close(self) -> None:
        """Close the scratch database (the backend and ledger belong to the engine)."""
        with self._scratch_lock:
            if self._scratch is not None:
                self._scratch.close()
                self._scratch = None

    def verify_outgoing(self, sql: str, release: Release, tables: Sequence[str] = (),
                        variants: bool = False, groups: int | None = None,
                        group_keys: int | None = None, cap: int | None = None,
                        gate: str | None = None) -> None:
        """The outgoing check (``analyses.outgoing``, wall 4) of a statement about to run:
        InternalError if it reads a private table outside the bounding-and-noise structure,
        or one not among ``tables`` (those its analysis reads).  Every statement derived from
        analyst SQL passes here before the backend sees it.

        ``variants``: the statement is one of a family that differ in numbers only (a query
        at its limit cap, then at the chosen cap and bounds): its verdict is kept by its
        literal shape (``analyses.outgoing.literal_shape``) and carried over to the others.
        ``groups``: the groups per unit g the query's noise and key-release threshold assume
        (its rows must be bounded to g groups per unit; None: no such bound), the groups of
        the first ``group_keys`` GROUP BY expressions (None: all of them).  ``cap``: the
        rows per unit k its noise assumes (every row cap in it must be at most k; None: at
        most each table's limit).  ``gate``: the output the proxy's key-release threshold
        reads, when the proxy adds the noise (None: none)."""
        # A digest of the text, not the text (several kB per statement), as the cache key.
        key = (hashlib.blake2b(sql.encode(), digest_size=16).digest(), release, groups,
               group_keys, cap, gate, *sorted(tables))
        if key in self._verified:
            return
        if not variants:
            check_outgoing(sql, self.dialect, self.outgoing, release, frozenset(tables),
                           groups=groups, group_keys=group_keys, cap=cap, gate=gate)
            self._verified.put(key, True)
            return
        # The later variants pass by their tokens (the parse and the rules are most of the
        # check); the first is parsed from the same tokens.  The shape keeps whether each
        # capped literal is at most the cap and each limit, so a variant at another cap
        # passes only when its caps compare with its own cap as the first's with the first's.
        cut = tokens(sql, self.dialect)
        caps = cap_bounds(self.outgoing, cap)
        shape = None if cut is None else (literal_shape(cut, groups, caps), release, groups,
                                          group_keys, cap is None, gate, *sorted(tables))
        if shape is None or shape not in self._shapes:
            check_outgoing(sql, self.dialect, self.outgoing, release, frozenset(tables), cut,
                           groups, group_keys, cap, gate)
            if shape is not None:
                self._shapes.put(shape, True)
        self._verified.put(key, True)

    def run_constant(self, sql: str) -> bool:
        """Run a statement that reads no table on the backend: True when it succeeds.

        The totality analysis (``analyses.totality``) judges literals, LIKE patterns and time
        functions by what the backend itself does; verdicts are cached per statement.
        """
        verdict = self._constants.get(sql)
        if verdict is None:
            try:
                self.backend.run(sql)
                verdict = True
            except StatementFailed:
                verdict = False
            self._constants.put(sql, verdict)
        return verdict

    def check_plans(self, statements: Sequence[str]) -> None:
        """Have the database plan every statement of a query (EXPLAIN), reading no row: one it
        cannot plan is refused here, before the claim, so it costs nothing.

        The verdict "plans fine" is kept per statement text: the text of a query shape (its
        final statement at the limit cap and declared bounds, its histograms) is the same on
        every call, so the extra round trip is paid once per shape.  A failure is not kept: it
        raises, and is rare.
        """
        for sql in statements:
            if sql in self._planned:
                continue
            try:
                self.backend.run("EXPLAIN " + sql)
            except StatementFailed as err:
                # EXPLAIN reads no row, whatever the backend's classification of the error.
                log.warning("a rewritten statement does not plan; refused before the claim")
                log.debug("plan error detail: %s", err.detail)
                raise QueryRefused(
                    "the database cannot plan this query (e.g. a function applied to an "
                    "argument of the wrong type); nothing was charged",
                    hint="check the types of the query's expressions; if the query is valid "
                    "SQL for the database, this is a bug in the proxy: please report it",
                ) from None
            self._planned.put(sql, True)

    def scratch(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own to the engine's in-memory DuckDB, where proxy noise finishes
        an answer over its noisy values.  Opening a database costs about 35 ms, a cursor under
        1 ms; tables a query makes there are TEMP, so each cursor sees only its own."""
        with self._scratch_lock:
            if self._scratch is None:
                self._scratch = duckdb.connect(":memory:")
            return self._scratch.cursor()

    def check_scratch_plan(self, create: str, finish: str) -> None:
        """Plan a proxy-noise finish (``finish``, DuckDB SQL) over the empty table ``create``
        makes, reading nothing: one that cannot plan is refused before the claim."""
        if (create, finish) in self._planned:
            return
        con = self.scratch()
        try:
            con.execute(create)
            con.execute("EXPLAIN " + finish)
        except duckdb.Error as err:
            log.warning("a proxy-noise finish does not plan; refused before the claim")
            log.debug("plan error detail: %s", err)
            raise QueryRefused(
                "the outputs of this query cannot be computed from its noisy aggregates (e.g. "
                "a function applied to an argument of the wrong type); nothing was charged",
                hint="check the types of the query's output expressions") from None
        finally:
            con.close()
        self._planned.put((create, finish), True)

    def run(self, sql: str, run: QueryRun | None, public: bool = False) -> ResultSet:
        """Run one statement of a query; ``run`` is the query's charge (None: nothing claimed,
        e.g. a public query; ``public``: a public-only query, on the restricted connection).
        A failure refunds the claim only when no statement of the query read a row (Wall 6);
        the message never quotes the database's, which may hold data."""
        return self._guarded(
            lambda: self.backend.run_public(sql) if public else self.backend.run(sql), run)

    def run_integers(self, sql: str, run: QueryRun | None) -> tuple[np.ndarray, ...]:
        """:meth:`run` for a statement whose columns all hold integers (a histogram's keys
        by index, bins and counts): its columns as int64 arrays, NULL as -1
        (``Backend.run_integers``).  Failures are handled as :meth:`run` handles them."""
        return self._guarded(lambda: self.backend.run_integers(sql), run)

    def _guarded(self, call: Callable[[], T], run: QueryRun | None) -> T:
        """``call`` (one statement sent to the backend) under the query's charge ``run``: a
        failure refunds it only when no statement of the query read a row (:meth:`run`)."""
        if run is None:
            run = QueryRun(None)
        try:
            result = call()
        except StatementFailed as err:
            # The detail may quote data values: operators see it at debug level, analysts never.
            log.warning("backend error on a rewritten query (touched data: %s)", err.touched_data)
            log.debug("backend error detail: %s", err.detail)
            if STREAM_ORDER_ERROR in str(err.detail):  # our own text: no data in it
                log.error("DuckDB met a ranked copy's twin out of the twin's order: the query "
                          "failed instead of keeping more rows per unit "
                          "(rewriters.contribution.streamed_rank); please report it with "
                          "the DuckDB version")
            run.failed(err.touched_data)
            refunded = run.refund_if_untouched(self.ledger)
            if err.cancelled is not None:
                raise StatementCanceled(
                    f"canceling statement due to {err.cancelled}",
                    hint=("the budget of this query was charged (the database may have read "
                          "rows); " if run.claim is not None and not refunded else "")
                    + "ask for less work; the data owner sets backend.statement_timeout_seconds",
                ) from None
            if refunded or (run.claim is None and not err.touched_data):
                raise InternalError(
                    "the database could not plan the rewritten query; nothing was charged",
                    hint="this is a bug in the proxy: please report the query",
                ) from None
            if run.claim is None:  # a public query, or one that reads no block
                raise BackendError(
                    "the database failed while evaluating the query; no detail is shown "
                    "because it could depend on the data",
                    hint="nothing was charged (the query claims no budget); check the query's "
                    "expressions",
                ) from None
            raise BackendError(
                "the database failed while evaluating the query; no detail is shown "
                "because it could depend on the data",
                hint="the budget of this query was charged, as a statement of it read the "
                "data; check the query's expressions",
            ) from None
        run.read()
        return result

    def run_stored(self, sql: str, run: QueryRun | None) -> ResultSet:
        """:meth:`run` for a statement whose result is a function of relations the proxy stored
        and never changes under their names (a ranked copy is named by its table's version:
        ``chorus_py.stores.samples``): run once, then read from memory by its text.  The result
        is exact and stays in the proxy (the caller adds fresh noise every time); a result
        read from memory counts as rows read, so no later failure refunds the query (Wall 6:
        its private choices were made on the data)."""
        hit = self._stored.get(sql)
        if hit is None:
            hit = self.run(sql, run)
            self._stored.put(sql, hit)
        elif run is not None:
            run.read()
        return hit

    def run_parts(self, parts: Sequence[str], run: QueryRun | None) -> ResultSet:
        """Run the ``parts`` of one statement side by side (``Backend.run_side_by_side``): the
        rows of all, in order, as one result.  Each part returns the same columns, and the
        caller's reading of the rows must add up over them (the choices' cells: a part keeps
        whole units).  Failures are handled as :meth:`run` handles them."""
        def joined() -> ResultSet:
            results = self.backend.run_side_by_side(parts)
            return ResultSet(results[0].columns, results[0].types,
                             [row for result in results for row in result.rows])
        return self._guarded(joined, run)

    def run_remembered(self, sql: str, run: QueryRun | None, what: Hashable,
                       derive: Callable[[Any], T], integers: bool = False,
                       parts: Sequence[str] = ()) -> T:
        """:meth:`run_stored_as` that keeps only the derived value, not the result: for a
        statement over stored relations whose text the analyst shapes (a filter), so that
        many texts hold many small derived values (a selection's marginals, a quantile's
        histogram cells) and never many results.  ``derive`` must be a pure function of the
        result (of its integer columns, :meth:`run_integers`, with ``integers``); its value is
        shared by every later call (the caller must not change it: arrays read-only).  The
        values kept are bounded by their bytes (``REMEMBERED_BYTES``).  A value read from
        memory counts as rows read, as in :meth:`run_stored`.  ``parts``: ``sql`` cut into
        statements whose rows together are its rows (:meth:`run_parts`), run instead of it
        (not with ``integers``); the value is remembered under ``sql``."""
        hit = self._remembered.get((sql, what))
        if hit is None:
            if parts:
                result: Any = self.run_parts(parts, run)
            else:
                result = self.run_integers(sql, run) if integers else self.run(sql, run)
            value = derive(result)
            self._remembered.put((sql, what), (value,), _footprint(value))
            return value
        if run is not None:
            run.read()
        return hit[0]

    def run_stored_as(self, sql: str, run: QueryRun | None, what: Hashable,
                      derive: Callable[[ResultSet], T]) -> T:
        """:meth:`run_stored`, then ``derive`` of its result, remembered with that result
        (under ``what``): ``derive`` must be a pure function of the result, and its value is
        shared by every later call (the caller must not change it)."""
        result = self.run_stored(sql, run)
        hit = self._derived.get((sql, what))
        if hit is not None and hit[0] is result:  # derived from this very result
            return hit[1]
        value = derive(result)
        self._derived.put((sql, what), (result, value))
        return value


def _footprint(value: object) -> int:
    """About how many bytes ``value`` holds: its arrays' bytes, and a word or so per item of
    its mappings, sequences and dataclass fields (what :meth:`Statements.run_remembered`
    keeps)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes) + 112
    if isinstance(value, Mapping):
        return 64 + sum(_footprint(k) + _footprint(v) for k, v in value.items())
    if isinstance(value, tuple | list):
        return 56 + sum(8 + _footprint(v) for v in value)
    if dataclasses.is_dataclass(value):
        return 56 + sum(_footprint(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 32
