"""The outgoing verifier (DESIGN.md section 11, wall 4): a last, separate look at the SQL itself.

Everything before it (binding, analysis, rewriting) decides what the database may read; this
module only re-reads the final statement, the exact text that is about to run, and checks that a
private table is read nowhere but inside the structure the rewriter emits.  It shares no code
with the binding or the rewriter, so a bug there is not repeated here.  A statement that fails
is never run (the engine raises InternalError "refused by the outgoing check").

The structure, for every reference to a private table T (or to its stored bounded sample in the
proxy's schema, ``chorus_private.T__bounded_*`` / ``T__attr_*``):

1. *Binding.*  Names are resolved by scope in the statement; a CTE may not carry the name of a
   table (declared or referenced), so no CTE can stand in for a table or the other way round.
   Every base table is a declared one qualified by the proxy's schema (the proxy generates
   every statement so, wall 3) or a stored sample in its private schema; anything else, a bare
   name included, is refused.
2. *Direct read.*  T is a source (FROM / JOIN) of a SELECT, and when the policy gives T a block
   column, that SELECT's WHERE restricts it to literal windows (``lo <= a.col AND a.col < hi``,
   or an OR of such windows): the claimed blocks.
3. *Aggregation barrier.*  Some SELECT on the way up from T aggregates (GROUP BY or a plain
   aggregate).  The first one, the barrier, has no HAVING, ORDER, LIMIT, OFFSET or DISTINCT and
   no subquery outside its FROM; its aggregates are COUNT, SUM, AVG, VARIANCE or STDDEV; each of
   its outputs is a GROUP BY expression or reads columns only inside aggregates.  So nothing of
   T leaves the barrier but aggregates and group keys.
3'. *Per-person barrier* (issue 24, ``analyses.per_person``): the direct reader of T groups
   by one privacy-unit column alone, T is that column's table or inner-joined to it by ON
   equalities of unit columns (its rows in a group are then the group's unit's own), and
   every output is bounded by literals (LEAST/GREATEST
   with a literal, CASE branches, casts; Postgres skips NULL arguments of LEAST and GREATEST,
   so only a literal argument binds).  Each unit is then one row of bounded values, and rule 4
   is met without a row cap.  Above it the rows are read through FROM only, by SELECTs without
   joins, subqueries, LIMIT, OFFSET, DISTINCT or windows, up to the first aggregating SELECT,
   which must pass rule 3 and is the barrier rule 5 checks.
4. *Contribution bounding* (T has a privacy unit and is read directly, not through its sample):
   between T and the barrier, ``ROW_NUMBER() OVER (PARTITION BY unit ...) AS r`` (or the
   running count ``COUNT(*) OVER (PARTITION BY unit ORDER BY __chorus_rank ROWS BETWEEN
   UNBOUNDED PRECEDING AND CURRENT ROW) AS r``, the same numbers: ``_numbers_rows``) and,
   above it, a filter ``r <= k`` (at most k rows per unit); or, for the proxy's selection
   histograms, rows grouped by the unit then only counted (by the read's own unit column
   alone, or by it and other keys then by it alone, each level the only source of the
   next, no ROLLUP, CUBE, GROUPING SETS nor join up to the counts: ``_one_row_per_unit``),
   or each row weighted by
   ``1 / COUNT(*) OVER (PARTITION BY unit)`` or marked by ``CASE WHEN ROW_NUMBER() OVER
   (PARTITION BY unit) = 1 THEN 1 ELSE 0 END`` (one row of each unit).  A ranked copy
   (``chorus_private.T__ranked_*``, every row of T with its unit's row count,
   ``__chorus_unit_rows``, and its random rank 1..n_u in its unit, ``__chorus_rank``) is not
   bounded by itself: it needs one of those, or, read directly, ``__chorus_unit_rows <= k`` in
   the reading SELECT's WHERE (the light units, whose k rows at most are all kept) or
   ``__chorus_rank <= k`` there (k rows per unit at most), or its row numbers partitioned by
   the copy's own ``__chorus_unit_rows`` then the unit (one count per unit: the same
   partitions, ``_presorted``), or, read directly, the streamed flag of
   ``rewriters.contribution.streamed_rank`` (``_streamed_numbering``: LAGs of one ``OVER ()``
   window flag the first k rows of each run of the copy's stored run number
   ``__chorus_run``, the rows above keep the flagged ones, and the statement fails unless
   the copy's stored positions ``__chorus_pos`` grow along that window, which makes each
   unit one run), or, for the selection histograms,
   each row weighted by ``1 / __chorus_unit_rows`` or marked by ``CASE WHEN __chorus_rank = 1
   THEN 1 ELSE 0 END`` in the reading SELECT, or there weighted by ``1 / COUNT(...) OVER
   (PARTITION BY unit)`` and marked by ``CASE WHEN __chorus_rank = MIN(__chorus_rank) OVER
   (PARTITION BY unit) THEN 1 ELSE 0 END`` (both ranks the copy's own, the window whole: a
   unit's stored ranks are distinct, so one of the rows the reader keeps holds their least),
   either window also partitioned by the copy's own ``__chorus_unit_rows`` then the unit,
   and only SUMs of such weights at the barrier (a unit's rows weigh at most 1 in all, per
   SUM).  A weight's numerator, and a mark's number
   and value, must be the literal 1.  Within one aggregation, the reads of one copy make
   occurrences of its table, each a read bounded by itself or the light and heavy branches
   (``<= K``, ``> K``, one K) as the two sides of one UNION ALL, or the three parts of
   thresholded keys (``<= g``; ``> g AND <= k``; ``> k``) as the sides of one UNION ALL: the
   parts' ranges of ``__chorus_unit_rows`` cut the whole range at their Ks; a light branch is
   never read alone, unless the aggregation sums only weights and marks of the copy's rows
   (``_weighed_read``: a selection histogram's part, whose comparison keeps whole units);
   several occurrences of one copy (a self-join) are distinct sources of one join.
   Wherever a window is partitioned by the unit, the unit is the read's own column
   (``_foreign_unit``): in the direct reader the read's, above it a name that comes down
   unchanged to it (``_own_unit``), never another source's column of that name in a join nor
   an alias of that name over another expression.
   Every such k and K (``r <= k``, ``__chorus_rank <= k``, ``__chorus_unit_rows <= K``) is an
   int at most the statement's cap (the rows per unit its noise assumes, when the caller
   passes it) and at most the table's limit (the policy's ``max_rows_per_unit``): a bound
   of more rows than the noise was scaled to bounds nothing that matters.
4''. *Groups per unit* (keys released by a threshold with g < k groups per unit: the noise
   and the threshold assume each unit in at most g groups; the caller passes g): every read
   keeps only units of at most g rows in the copy (``__chorus_unit_rows <= K``, K <= g), or,
   between it and the barrier, ``DENSE_RANK() OVER (PARTITION BY unit ORDER BY o...) AS gr``
   with ``gr <= G`` (G <= g) above it, each GROUP BY key of the barrier (or the first n, a
   quantile histogram's keys before its bins) being one of the o's, traced down to the
   table's columns by name through FROM subqueries and through UNIONs whose sides list the
   same names in order (``_check_groups``).
   Or the read is of the copy's grouped twin ``chorus_private.T__ranked_<16 hex>_g<8 hex>``
   (``rewriters.grouped_copy``: the copy's rows with ``__chorus_grank``, the DENSE_RANK of
   each unit's groups over its stored key columns ``__chorus_gk0, ...``), its reader's WHERE
   ANDs ``__chorus_grank <= G`` (G <= g) and every key traces to one of those stored key
   columns (``_stored_group_ranks``).
   The copy's twin ``chorus_private.T__ranked_*_u`` (the same rows in unit order), its month
   twin ``chorus_private.T__ranked_*_m`` (the same rows by calendar month ``__chorus_month``,
   then in unit order, its ``__chorus_pos`` renumbered in that order) and its grouped twins
   count as the copy itself: their reads and the copy's make the occurrences of one
   relation.  A month twin is read one month at a time: its reader's WHERE ANDs
   ``__chorus_month = <int literal>`` (``_one_month``), in which each unit's rows are one run.
5. *Noise.*  A statement whose answer is released by the database (``noised_in_sql``) is
   ``WITH chorus_noisy AS MATERIALIZED (N) SELECT ... FROM chorus_noisy [WHERE ...]``: N reads
   only ``(E) AS chorus_exact``, every output of N is either a group key passed through or an
   expression with RANDOM() (noise), every barrier lies inside E, and E is the barrier itself,
   the public-values grid LEFT JOIN the barrier, or ``SELECT ... FROM (barrier) AS e WHERE
   FALSE`` (no declared key left: no row).  Where the barrier is named, the sum of a ranked
   copy's two branches may stand, on every release (the proxy's noise, too, is calibrated
   to one aggregation): ``SELECT keys, SUM(m) ... FROM (B1 UNION ALL B2 [UNION ALL B3]) AS
   p GROUP BY keys``, barriers that read the copy with ``__chorus_unit_rows <= K`` and ``>
   K`` (or the three parts' ranges; each unit in one of them only; one barrier that reads
   the copy in two or three parts, their UNION ALL, passes only with the same test, as does
   each such pair of a join's sources).
   The grid is made of literal VALUES and of SELECTs
   that read public tables only (keys from a joined public table: ``rewriters.keys``).  Keys
   that come from rows (not from the grid) need a ``noisy column > literal`` threshold in the
   outer WHERE, the key-release gate, whose noisy column is noise over one column of E that
   counts each unit at most once per group, in every aggregation it adds up (``_unit_count``;
   the threshold is calibrated for that count): ``COUNT(DISTINCT c)``, c the reads' own unit
   column (its value traced unchanged down to them, ``_origins``), every other read with
   a unit joined to them by ON equalities of unit columns where their sources meet; a grouped
   twin's count of its marks (``COUNT(CASE WHEN __chorus_rank = __chorus_gscore THEN unit
   END)``, ``SUM(__chorus_gfirst)``, the twin's own columns) under a GROUP BY of exactly its
   stored key columns, in order (their names' digest is in its name: one mark per unit and
   group of those keys); or ``COUNT(*)`` where no read has a unit, or every read is under a
   per-person barrier.  A statement whose exact result goes to the proxy's noise
   (``noised_by_proxy``: answers in proxy mode, selection histograms; ``sampled`` for
   sampled sensitivity, which may also take percentiles) needs 1-4, and, where the caller
   names the output the proxy's key-release threshold reads (``gate``), that output of the
   statement itself (no SELECT above the aggregation) must count units as a gate does; one
   released exactly (``exact``: public queries) may read no private table at all.

A verdict carries over to a statement that differs from a verified one only in literal values
no rule reads (:func:`literal_shape`): the statement at a query's limit cap and its final
statement at the chosen cap and bounds are one text with other numbers.  The rules above read a
number's value only through ``_constant`` (the numerator and mark of rule 4 are 1, the mark's
else 0, a per-person bound is finite), ``Literal.is_int`` of a literal compared to a column
(rule 4's ``r <= k`` and ``r = 1``), whether such a literal is at most g (rule 4'', g given),
whether one right after ``<=``, or the offset of ``LAG(column, n``, is at most the cap and
each limit (rule 4), and the order of
the Ks of ``__chorus_unit_rows <= K`` and ``> K`` (the parts' ranges); no rule reads a string's
value.  A rule that reads more of a literal must add it to ``_number_class``.
"""

from __future__ import annotations

import array
import functools
import hashlib
import itertools
import logging
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from chorus_py.errors import InternalError
from chorus_py.policy import Policy

log = logging.getLogger("chorus.outgoing")

Release = Literal["exact", "noised_in_sql", "noised_by_proxy", "sampled"]

NOISY = "chorus_noisy"       # the rewriter's noise CTE (rewriters.pipeline.NOISY)
EXACT = "chorus_exact"       # its source (rewriters.noise)
_SAMPLE_MARKERS = ("__bounded_", "__attr_")
_RANKED_MARKER = "__ranked_"   # a ranked copy: all of T's rows, not bounded (rule 4)
# A ranked copy's twin, ``<copy>_u``: the copy's rows in unit order, one occurrence with it.
# Its month twin, ``<copy>_m``: the copy's rows by calendar month (``__chorus_month``), then in
# unit order; its positions number that order.  Read one month at a time (``_one_month``).
_MONTH_TWIN = re.compile(r"(.*__ranked_[0-9a-f]{16})_m")
_MONTH = "__chorus_month"
# Its grouped twin over key columns, ``<copy>_g<8 hex>``: the copy's rows with each unit's
# groups ranked (``__chorus_grank`` over ``__chorus_gk0, ...``), one occurrence with it too.
_GROUPED_TWIN = re.compile(r"(.*__ranked_[0-9a-f]{16})_g[0-9a-f]{8}")
_GROUPED_RANK = "__chorus_grank"
# Its group score (the least stored rank of a unit's rows in each group of the stored keys) and
# mark (1 on one row of each such group): with the stored rank, the twin's counts of distinct
# units of a group (``_twin_units``).
_GROUP_SCORE = "__chorus_gscore"
_GROUP_FIRST = "__chorus_gfirst"
# The only relations of a ranked copy read by name: the copy (group 1; its table, group 2) and
# its twins.  (A Postgres month twin's partitions, ``<copy>_m_<month>``, hold one month of its
# rows each and are read only through it, pinned to the month: a partition named directly
# would be a relation of its own to rules 4 and 4', a second occurrence of the copy's rows.)
_RANKED_RELATION = re.compile(r"((.*)__ranked_[0-9a-f]{16})(?:_u|_m|_g[0-9a-f]{8})?")
_GROUPED_KEY = re.compile(r"__chorus_gk\d+")
_UNIT_ROWS = "__chorus_unit_rows"
_STORED_RANK = "__chorus_rank"  # a ranked copy's random rank of a row in its unit, 1..n_u
# A DuckDB ranked copy's row position in its twin's order (unit row count, unit, stored rank).
_POSITION = "__chorus_pos"
# And the position of its unit's first row there: one number per unit, >= 1 (a month twin
# keeps it).
_RUN = "__chorus_run"
_BARRIER_AGGREGATES: tuple[type[exp.Expr], ...] = (
    exp.Count, exp.Sum, exp.Avg, exp.Variance, exp.VariancePop, exp.Stddev, exp.StddevPop,
    exp.StddevSamp)
# Sampled sensitivity (``chorus_py.kinds.sampled``) calibrates the noise of any statistic from
# samples, percentiles included.
_SAMPLED_AGGREGATES = (*_BARRIER_AGGREGATES, exp.Median, exp.PercentileCont,
                       exp.PercentileDisc, exp.Quantile)
_FORBIDDEN_IN_BARRIER = ("having", "order", "limit", "offset", "distinct", "qualify")


@dataclass(frozen=True)
class PrivateTable:
    """What the verifier needs of a private table: its unit and block columns (or None), and
    its limit, the most rows per unit any statement may keep (rule 4's K and k: the policy's
    ``max_rows_per_unit``; None: no unit)."""

    unit: str | None
    block: str | None
    limit: int | None = None


@dataclass(frozen=True)
class OutgoingRules:
    """The policy as the verifier sees it."""

    public: frozenset[str]
    private: Mapping[str, PrivateTable]
    schema: str | None          # the proxy's default schema (bare names resolve in it)
    private_schema: str         # the proxy's own schema of stored samples


class Refused(Exception):
    """The statement breaks the structure; the message says which rule."""


_PLAIN_NUMBER = re.compile(r"\d+(\.\d+)?")
# A mechanism parameter as rewriters print it: '<repr(float)>' (mechanisms.base.float_literal).
_FLOAT_TEXT = re.compile(r"-?\d+(\.\d+)?(e[+-]\d+)?")


_KIND = {kind: i for i, kind in enumerate(TokenType)}
_NUMBER, _STRING = TokenType.NUMBER, TokenType.STRING
_ROW_COUNT_TESTS = frozenset({TokenType.LTE, TokenType.GT})
_COMMA = TokenType.COMMA
_NAME_TOKENS = frozenset({TokenType.VAR, TokenType.IDENTIFIER})
_COMPARISONS = frozenset({TokenType.LT, TokenType.LTE, TokenType.GT, TokenType.GTE, TokenType.EQ,
                          TokenType.NEQ})


def _number_class(text: str, compared: bool, order: dict[Fraction, int] | None,
                  groups: int | None, caps: tuple[int, ...] = (), capped: bool = False) -> str:
    """Everything the rules read of a numeric literal: through ``_constant`` whether it is 0,
    1 (rule 4's mark and weight) or finite (rule 3'), as 0/1 digits; for a literal right after
    a comparison (``compared``: the literal that is a comparison's right side is the token
    right after its operator), ``is_int`` (rule 4's ``r <= k`` and ``r = 1``) and, with a
    groups bound, whether it is at most ``groups`` (rule 4'' reads ``<= G`` and ``<= K`` so);
    for one right after ``<=`` (``capped``), whether it is at most each of ``caps`` (rule 4
    reads its ``r <= k`` and ``<= K`` against the statement's cap and the tables' limits);
    and for the K of ``__chorus_unit_rows <= K`` or ``> K`` (``order``, the rank of every such
    K's exact value among them all), its rank (the parts' ranges are disjoint or not by the
    order of their Ks)."""
    value = float(text)
    out = f"{value == 0:d}{value == 1:d}{math.isfinite(value):d}"
    if compared:
        out += f"{'.' not in text:d}"
        if groups is not None:
            out += f"{value <= groups:d}"
    if capped:
        out += "".join(f"{value <= cap:d}" for cap in caps)
    if order is not None:
        out += f":{order[Fraction(text)]}"
    return out


@functools.lru_cache(maxsize=8)
def _dialect(dialect: str) -> Dialect:
    return Dialect.get_or_raise(dialect)


def tokens(sql: str, dialect: str) -> list[Token] | None:
    """``sql`` cut by the tokenizer the verifier's parser reads (None: it cannot be cut; the
    verifier then refuses it as a statement that does not parse)."""
    try:
        return _dialect(dialect).tokenize(sql)
    except (TokenError, RecursionError):
        return None


def literal_shape(cut: list[Token], groups: int | None = None,
                  caps: tuple[int, ...] = ()) -> bytes:
    """A digest of a statement's tokens in which only literal values no rule reads are blanked:
    two statements with the same digest pass the rules alike (module docstring), at the same
    ``groups`` bound (``verify``'s; None: none) and the same ``caps`` (:func:`cap_bounds`:
    ``verify``'s cap and the tables' limits).

    Every token keeps its type, comments and text, except a number written as digits with an
    optional fraction (no sign: a minus is a token of its own), which keeps only its
    :func:`_number_class`, and a string that prints a float.  The parser builds a tree from
    token types and texts, a number's text going only into its Literal: the same digest, the
    same tree but for those literals' values.
    """
    kinds = [token.token_type for token in cut]
    texts = [token.text for token in cut]
    blanked: list[int] = []
    number, string, lte = _NUMBER, _STRING, TokenType.LTE  # locals: enum members look up slowly
    # ``a.__chorus_unit_rows <= K``: the column's name is the token before the operator (a
    # parenthesised column is no Column to the rule, and reads no K).
    unit_rows = {i for i, kind in enumerate(kinds)
                 if kind is number and i > 1 and kinds[i - 1] in _ROW_COUNT_TESTS
                 and texts[i - 2] == _UNIT_ROWS and _PLAIN_NUMBER.fullmatch(texts[i])}
    order = {v: r for r, v in enumerate(sorted({Fraction(texts[i]) for i in unit_rows}))}
    for i, kind in enumerate(kinds):
        if kind is number and _PLAIN_NUMBER.fullmatch(texts[i]):
            # ``LAG(column, n`` : rule 4's streamed numbering reads n as it reads a row cap.
            offset = i > 0 and kinds[i - 1] is _COMMA and _lag_offset(kinds, texts, i)
            compared = offset or (i > 0 and kinds[i - 1] in _COMPARISONS)
            texts[i] = _number_class(texts[i], compared, order if i in unit_rows else None,
                                     groups, caps, offset or (compared and kinds[i - 1] is lte))
            blanked.append(i)
        elif kind is string and _FLOAT_TEXT.fullmatch(texts[i]):
            texts[i] = ""
            blanked.append(i)
    digest = hashlib.blake2b(digest_size=16)
    # Types, which tokens are blanked, the texts' lengths, then the texts: no two token lists
    # give the same bytes unless they differ only in blanked values of the same class.
    digest.update(array.array("H", [_KIND[kind] for kind in kinds]).tobytes())
    digest.update(array.array("Q", [len(blanked), *blanked]).tobytes())
    digest.update(array.array("Q", [len(text) for text in texts]).tobytes())
    digest.update("".join(texts).encode())
    digest.update(repr([(i, token.comments) for i, token in enumerate(cut)
                        if token.comments]).encode())
    return digest.digest()


def _lag_offset(kinds: list[TokenType], texts: list[str], i: int) -> bool:
    """Whether the number token ``i`` is the offset of ``LAG(column, i ...``: its tokens
    before are ``LAG (``, a column's names joined by dots, then a comma (the only form whose
    offset rule 4 reads: ``_streamed_numbering`` refuses any other first argument)."""
    j = i - 2
    while j >= 0 and kinds[j] in _NAME_TOKENS:
        if j == 0 or kinds[j - 1] is not TokenType.DOT:
            break
        j -= 2
    return j >= 2 and kinds[j] in _NAME_TOKENS and kinds[j - 1] is TokenType.L_PAREN \
        and kinds[j - 2] is TokenType.VAR and texts[j - 2].upper() == "LAG"


def cap_bounds(rules: OutgoingRules, cap: int | None) -> tuple[int, ...]:
    """The numbers rule 4 compares a statement's row caps with (:func:`literal_shape`'s
    ``caps``): its ``cap`` first (when given), then every private table's limit in order.
    Statements of one family at different caps (a query at its limit, then at the chosen
    cap) get tuples of one length that differ in the first place only: a capped literal
    that is the statement's own cap is at most it in both."""
    limits = sorted({t.limit for t in rules.private.values() if t.limit is not None})
    return tuple(limits if cap is None else [cap, *limits])


def check_outgoing(sql: str, dialect: str, rules: OutgoingRules, release: Release,
                   tables: frozenset[str], cut: list[Token] | None = None,
                   groups: int | None = None, group_keys: int | None = None,
                   cap: int | None = None, gate: str | None = None) -> None:
    """Raise InternalError (logged at error level with ``sql``) unless ``sql`` reads private
    tables only inside the bounding-and-noise structure (module docstring) and reads no
    private table outside ``tables``, those the analysis said the query reads.  ``cut``: the
    text's :func:`tokens`, when the caller has them.  ``groups``: the groups per unit g the
    noise and the key-release threshold assume (rule 4''; None: the row cap alone), in the
    groups of the first ``group_keys`` GROUP BY expressions of the aggregation (None: all of
    them; a quantile histogram's last one is its bins).  ``cap``: the rows per unit k the
    noise assumes of every table read with a row cap (rule 4: every cap at most k; None:
    at most each table's limit).  ``gate``: the output of a statement whose exact result
    goes to the proxy's noise that the proxy's key-release threshold reads (it must count
    each unit at most once per group, as rule 5's gate; None: no threshold)."""
    try:
        verify(sql, dialect, rules, release, tables, cut, groups, group_keys, cap, gate)
    except Refused as err:
        log.error("refused by the outgoing check (%s): %s", err, sql)
        raise InternalError(
            f"refused by the outgoing check: {err}; the statement did not run",
            hint="this is a bug in the proxy: please report the query") from None


def verify(sql: str, dialect: str, rules: OutgoingRules, release: Release,
           tables: frozenset[str], cut: list[Token] | None = None,
           groups: int | None = None, group_keys: int | None = None,
           cap: int | None = None, gate: str | None = None) -> None:
    """``check_outgoing`` without logging: raises Refused naming the broken rule."""
    try:
        # What sqlglot.parse does, from the tokens when given (cut from this very text).
        reader = _dialect(dialect)
        parsed = reader.parser().parse(reader.tokenize(sql) if cut is None else cut, sql)
        statements = [s for s in parsed if s is not None]
    except (ParseError, TokenError, RecursionError) as err:
        raise Refused(f"the statement does not parse ({type(err).__name__})") from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        raise Refused("the statement is not exactly one SELECT")
    tree = statements[0]
    reads = _base_tables(tree, rules)
    private = [(t, name) for t, name in reads if name not in rules.public]
    if not private:
        return
    extra = sorted({name for _, name in private} - tables)
    if extra:
        raise Refused(f"private table '{extra[0]}' is read but the analysis did not say so")
    if release == "exact":
        raise Refused(f"a statement released without noise reads private table '{private[0][1]}'")
    allowed = _SAMPLED_AGGREGATES if release == "sampled" else _BARRIER_AGGREGATES
    barriers: list[exp.Select] = []
    reads: dict[int, list[exp.Table]] = {}  # id(barrier) -> the private reads below it
    per_person: set[int] = set()  # id(table) of the reads under a per-person barrier (3')
    for table, name in private:
        barrier, person = _check_private_read(table, name, rules, allowed, cap)
        if person:
            per_person.add(id(table))
        if groups is not None:
            _check_groups(table, name, barrier, rules, groups, group_keys)
        # Several reads may share one barrier (a ranked copy's light and heavy branches).
        if not any(barrier is b for b in barriers):
            barriers.append(barrier)
        reads.setdefault(id(barrier), []).append(table)
    for barrier in barriers:  # each occurrence of a ranked copy bounded as a whole
        # Two aggregations: each must be one branch of the copy, paired by _combination.
        _copy_occurrences(barrier, reads[id(barrier)], rules, paired=len(barriers) > 1)
    # One aggregation of the private rows, or the sum of a ranked copy's two branches' (on
    # every release: the proxy's noise, too, is calibrated to one aggregation's stability).
    measured = barriers[0] if len(barriers) == 1 else _combination(barriers, reads, rules)
    found = _Measured(barriers, reads, per_person)
    if release == "noised_in_sql":
        _check_noise(tree, measured, found, rules)
    elif gate is not None and (tree is not measured
                               or not _counts_units(gate, measured, found, rules)):
        raise Refused(f"the proxy's key-release threshold reads {gate}, which does not count "
                      "each unit at most once per group")


# -- 1. binding ------------------------------------------------------------------------------
def _base_tables(tree: exp.Select, rules: OutgoingRules) -> list[tuple[exp.Table, str]]:
    """Every base table reference with the declared table it reads (a sample: its table)."""
    refs: list[exp.Table] = []
    cte_names: set[str] = set()

    def visit(node: exp.Expr, env: frozenset[str]) -> None:
        with_ = node.args.get("with_")
        if isinstance(with_, exp.With):
            if with_.args.get("recursive"):
                raise Refused("WITH RECURSIVE")
            names = set(env)
            for cte in with_.expressions:
                visit(cte.this, frozenset(names))
                name = cte.alias_or_name.lower()
                cte_names.add(name)
                names.add(name)
            env = frozenset(names)
        if isinstance(node, exp.Table):
            if not isinstance(node.this, exp.Identifier):
                raise Refused(f"a table function ({node.sql()})")
            qualified = node.args.get("db") is not None or node.args.get("catalog") is not None
            if qualified or node.name.lower() not in env:
                refs.append(node)
            return
        for child in node.iter_expressions():  # every child node, in the order of its args
            if child.arg_key != "with_":
                visit(child, env)

    visit(tree, frozenset())
    declared = set(rules.public) | set(rules.private)
    shadowed = cte_names & ({n.lower() for n in declared} | {t.name.lower() for t in refs})
    if shadowed:
        raise Refused(f"a CTE is named like a table ({sorted(shadowed)[0]})")
    out = []
    for table in refs:
        out.append((table, _declared(table, rules)))
    return out


def _declared(table: exp.Table, rules: OutgoingRules) -> str:
    if table.args.get("catalog") is not None:
        raise Refused(f"a catalog-qualified table ({table.sql()})")
    db = table.args.get("db")
    name = table.name
    if db is not None and db.name == rules.private_schema:
        ranked = _RANKED_RELATION.fullmatch(name)
        if ranked is not None and ranked.group(2) in rules.private:
            return ranked.group(2)
        for marker in _SAMPLE_MARKERS:
            base = name.split(marker)[0]
            if marker in name and base in rules.private:
                return base
        raise Refused(f"an unknown relation of the private schema ({table.sql()})")
    if db is None or db.name != rules.schema:
        # The proxy generates every statement with each table qualified (wall 3): a bare name
        # is one a CTE or the search path could resolve to something else.
        raise Refused(f"a table not qualified by the proxy's schema ({table.sql()})")
    if name in rules.public or name in rules.private:
        return name
    raise Refused(f"a table the policy does not declare ({table.sql()})")


# -- 2-4. one private read -------------------------------------------------------------------
def _check_private_read(table: exp.Table, name: str, rules: OutgoingRules,
                        allowed: tuple[type[exp.Expr], ...], cap: int | None
                        ) -> tuple[exp.Select, bool]:
    """Check rules 2-4 for one reference; return its barrier, and whether the read is under
    a per-person barrier (rule 3': one row per unit reaches the barrier).  A row cap keeps at
    most ``most`` rows per unit: the statement's ``cap`` and the table's limit, the
    smaller."""
    chain = _select_ancestors(table)
    reader = chain[0] if chain else None
    holder = table.parent
    if reader is None or not isinstance(holder, exp.From | exp.Join) or holder.parent is not reader:
        raise Refused(f"private table '{name}' is not read as a source of a SELECT")
    alias = table.alias_or_name
    spec = rules.private[name]
    # An unqualified column is the table's when the SELECT reads nothing else.
    sole = not reader.args.get("joins")
    if spec.block is not None and not _restricted(reader.args.get("where"), alias, spec.block,
                                                  sole):
        raise Refused(f"private table '{name}' is read without the block restriction on "
                      f"{spec.block}")
    index = next((i for i, s in enumerate(chain) if _aggregates(s)), None)
    if index is None:
        raise Refused(f"private table '{name}' is read outside any aggregation")
    barrier = chain[index]
    db = table.args.get("db")
    stored = db is not None and db.name == rules.private_schema
    sample = stored and _RANKED_MARKER not in table.name  # bounded when it was stored
    if spec.unit is not None and not sample and index == 0 \
            and _per_person(barrier, alias, rules, name, allowed):
        return _above_per_person(chain, name, allowed), True
    _check_barrier(barrier, name, allowed)
    if spec.unit is not None and not sample:
        stranger = _foreign_unit(chain, index, spec.unit, alias, sole)
        if stranger is not None:
            raise Refused(f"{stranger} partitions the rows of private table '{name}' but is "
                          f"not its own {spec.unit} column")
    most = min(c for c in (cap, spec.limit, math.inf) if c is not None)
    light = stored and not sample and (_copy_capped(reader.args.get("where"), alias, sole, most)
                                       or _stored_weights(chain, index, alias, sole,
                                                          spec.unit))
    copy = (alias, sole) if stored and not sample else None
    if stored and _MONTH_TWIN.fullmatch(table.name) \
            and not _one_month(reader.args.get("where"), alias, sole):
        raise Refused(f"the month twin {table.name} is read without __chorus_month = <month>")
    if spec.unit is not None and not sample and not light \
            and not _bounded(chain, index, spec.unit, most, copy, (alias, sole)):
        raise Refused(f"private table '{name}' is read without contribution bounding per "
                      f"{spec.unit} to at most {most:g} rows")
    return barrier, False


# -- 4''. groups per unit ------------------------------------------------------------------
def _check_groups(table: exp.Table, name: str, barrier: exp.Select, rules: OutgoingRules,
                  groups: int, group_keys: int | None) -> None:
    """Refuse unless the rows of each unit that reach ``barrier`` from ``table`` fall in at
    most ``groups`` of its groups, those of its first ``group_keys`` GROUP BY expressions
    (None: all) (rule 4'', module docstring).

    Either the reading SELECT keeps only units of at most ``groups`` rows in the copy
    (``__chorus_unit_rows <= K``, K <= groups: K rows reach at most K groups), or a SELECT
    between the read and the barrier computes ``DENSE_RANK() OVER (PARTITION BY unit ORDER BY
    o1, o2, ...) AS gr`` and one above it, at or below the barrier, keeps ``gr <= G`` (an int
    G <= groups), where every GROUP BY key of the barrier is, traced down to the table's
    columns, one of the o_i (no RANDOM() in it).  DENSE_RANK gives equal ranks exactly to
    rows with equal (o1, o2, ...), so a unit's rows that pass have at most G distinct tuples,
    and its keys, each a function of the tuple, at most G distinct values.  The tracing
    follows FROM subqueries by column name (no join on the way); through a UNION, whose
    columns are matched by position, only when every side lists the same names in the same
    order (``_names``)."""
    spec = rules.private[name]
    group = barrier.args.get("group")
    if spec.unit is None or group is None:  # no unit to bound, or one group in all
        return
    chain = _select_ancestors(table)
    index = next(i for i, s in enumerate(chain) if s is barrier)
    below, _ = _unit_rows_bounds(table)
    if below and min(below) <= groups:
        return
    keys = [_at_source(k, chain, index) for k in group.expressions[:group_keys]]
    unjoined = not any(s.args.get("joins") for s in chain[: index + 1])
    if unjoined and _stored_group_ranks(table, chain[0], keys, rules, groups):
        return
    if unjoined and all(k is not None and k.find(exp.Rand) is None for k in keys):
        for i in range(index):
            for item in chain[i].expressions:
                window = item.this if isinstance(item, exp.Alias) else None
                if not (isinstance(window, exp.Window) and isinstance(window.this, exp.DenseRank)
                        and _partitioned_by(window, spec.unit)):
                    continue
                if not any(_rank_at_most(chain, j, i, window, groups)
                           for j in range(i + 1, index + 1)):
                    continue
                order = window.args.get("order")
                traced = [_at_source(o.this, chain, i) for o in
                          (order.expressions if order is not None else [])]
                ordered = {o.sql() for o in traced if o is not None}
                if all(k is not None and k.sql() in ordered for k in keys):
                    return
    raise Refused(f"the rows of '{name}' are not bounded to {groups} groups per {spec.unit} "
                  "(DENSE_RANK() OVER (PARTITION BY unit ORDER BY ..., keys) <= g)")


def _stored_group_ranks(table: exp.Table, reader: exp.Select, keys: list[exp.Expr | None],
                        rules: OutgoingRules, groups: int) -> bool:
    """Whether ``table`` is a grouped twin (``rewriters.grouped_copy``) read with
    ``alias.__chorus_grank <= G`` (an int G <= ``groups``) ANDed into its reader's WHERE and
    every key (the barrier's GROUP BY keys traced to the table, ``_at_source``) one of its
    stored key columns ``__chorus_gk<i>``, or the keys exactly the columns they store (their
    names' digest is the twin's, ``_key_digest``).  The proxy stores ``__chorus_grank`` as
    ``DENSE_RANK() OVER (PARTITION BY unit ORDER BY score, __chorus_gk0, ...)`` over the
    copy's rows: distinct key tuples of a unit have distinct ranks, so its rows of rank <= G
    have at most G tuples, and keys among their columns at most G values (a filter only drops
    rows)."""
    db = table.args.get("db")
    if db is None or db.name != rules.private_schema or not _GROUPED_TWIN.fullmatch(table.name):
        return False
    alias = table.alias_or_name
    sole = not reader.args.get("joins")
    capped = any(isinstance(c, exp.LTE) and isinstance(c.this, exp.Column)
                 and c.this.name == _GROUPED_RANK
                 and (c.this.table == alias or (sole and not c.this.table))
                 and _int_at_most(c.expression, groups)
                 for c in _conjuncts(reader.args.get("where")))
    if not capped or not keys or not all(isinstance(k, exp.Column) and not k.table
                                         for k in keys):
        return False
    names = [k.name for k in keys if isinstance(k, exp.Column)]
    # Its stored key columns, or the columns they store (the twin's name digests them).
    return all(_GROUPED_KEY.fullmatch(n) for n in names) \
        or table.name.endswith(f"_g{_key_digest(names)}")


def _rank_at_most(chain: list[exp.Select], level: int, window_level: int, window: exp.Window,
                  groups: int) -> bool:
    """Whether the WHERE of ``chain[level]`` ANDs ``c <= G`` (an int G <= ``groups``) where
    the column c is, traced down, ``window`` of ``chain[window_level]`` itself."""
    for c in _conjuncts(chain[level].args.get("where")):
        if isinstance(c, exp.LTE) and isinstance(c.this, exp.Column) \
                and isinstance(c.expression, exp.Literal) and c.expression.is_int \
                and int(c.expression.this) <= groups:
            origin = _origin(c.this.name, chain, level)
            if origin is not None and origin[0] == window_level and origin[1] is window:
                return True
    return False


def _is_star(item: exp.Expr) -> bool:
    return isinstance(item, exp.Star) or (isinstance(item, exp.Column)
                                         and isinstance(item.this, exp.Star))


def _feeds(below: exp.Select, above: exp.Select) -> bool:
    """Whether ``above`` reads ``below`` as its only source, directly or as a side of a UNION
    whose every side lists the same column names (``_names``): a name of ``above``'s source
    is then the column of that name in ``below``."""
    node: exp.Expr = below
    while isinstance(node.parent, exp.SetOperation):
        node = node.parent
    holder = node.parent
    if not (isinstance(holder, exp.Subquery) and isinstance(holder.parent, exp.From)
            and holder.parent.parent is above and not above.args.get("joins")):
        return False
    if node is below:
        return True
    sides: list[exp.Expr] = []
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, exp.SetOperation):
            pending += [current.this, current.expression]
        else:
            sides.append(current)
    names = [_names(side) if isinstance(side, exp.Select) else None for side in sides]
    first = names[0]
    return first is not None and len(set(first)) == len(first) \
        and all(n == first for n in names)


def _names(select: exp.Select) -> list[str] | None:
    """The output column names of ``select`` in order, a star of a subquery expanded, a star
    of a base table as one ``*name`` entry (None: a star over anything else)."""
    out: list[str] = []
    for item in select.expressions:
        if not _is_star(item):
            out.append(item.alias_or_name)
            continue
        source = select.args.get("from_")
        inner = source.this if source is not None else None
        if select.args.get("joins") or inner is None:
            return None
        if isinstance(inner, exp.Table):
            out.append(f"*{inner.name}")
        elif isinstance(inner, exp.Subquery) and isinstance(inner.this, exp.Select):
            expanded = _names(inner.this)
            if expanded is None:
                return None
            out += expanded
        else:
            return None
    return out


# The columns a ranked copy adds to its table (``rewriters.contribution.ranked_table``; its
# stored quantile bins ``__chorus_bin<i>``, ``rewriters.bins``, magnitude digits
# ``__chorus_mag<i>``, ``rewriters.selection.stored_digit_columns``, and clipped values
# ``__chorus_clip<i>``, ``rewriters.clipping.stored_clip_columns``: functions of one row's
# value, which no rule reads); any other ``__chorus_`` name is the rewriter's own, never a
# column of a declared table.
_COPY_COLUMNS = frozenset({_UNIT_ROWS, _STORED_RANK, "__chorus_rand", _POSITION})
_STORED_BIN = re.compile(r"__chorus_(?:bin|mag|clip)\d+")


def _origin(name: str, chain: list[exp.Select], level: int) -> tuple[int, exp.Expr] | None:
    """Where the column ``name`` of ``chain[level]``'s source is defined: (the level of the
    SELECT that defines it, its value there), (-1, the column) for a column of the table
    itself; None when unknown or ambiguous (a star that may carry the name beside an
    explicit one)."""
    while level > 0:
        below = chain[level - 1]
        if not _feeds(below, chain[level]):
            return None
        explicit = [e for e in below.expressions
                    if not _is_star(e) and e.alias_or_name == name]
        stars = any(_is_star(e) for e in below.expressions)
        if len(explicit) > 1 or (explicit and stars and _provides(name, chain, level - 1)):
            return None
        if explicit:
            item = explicit[0]
            return level - 1, item.this if isinstance(item, exp.Alias) else item
        if not stars:
            return None
        level -= 1
    return -1, exp.column(name)


def _provides(name: str, chain: list[exp.Select], level: int) -> bool:
    """Whether the source of ``chain[level]`` may carry a column ``name`` (a table: any name
    but the rewriter's own ``__chorus_`` ones)."""
    if level == 0:
        return not name.startswith("__chorus_") or name in _COPY_COLUMNS \
            or _STORED_BIN.fullmatch(name) is not None
    below = chain[level - 1]
    return any(not _is_star(e) and e.alias_or_name == name for e in below.expressions) or (
        any(_is_star(e) for e in below.expressions) and _provides(name, chain, level - 1))


def _at_source(node: exp.Expr, chain: list[exp.Select], level: int) -> exp.Expr | None:
    """``node``, an expression over the source of ``chain[level]``, with every column replaced
    by its definition over the table's own columns (unqualified); None when one is unknown."""
    out = node.copy()
    for column in list(out.find_all(exp.Column)):
        origin = _origin(column.name, chain, level)
        if origin is None:
            return None
        found = origin[1].copy() if origin[0] < 0 else _at_source(origin[1], chain, origin[0])
        if found is None:
            return None
        if column is out:
            return found
        column.replace(found)
    return out


# -- 3'. the per-person barrier ------------------------------------------------------------------
def _per_person(barrier: exp.Select, alias: str, rules: OutgoingRules, name: str,
                allowed: tuple[type[exp.Expr], ...]) -> bool:
    """Whether ``barrier`` (the direct reader of the table ``alias``) is ``SELECT clip(agg) AS
    v, ... FROM ... GROUP BY g.unit``: one row per unit, every output bounded by literals, and
    ``alias`` is g or inner-joined to it on the unit (``a.unit = g.unit``, a chain of such ON
    equalities), so a unit's row holds only that unit's rows (rule 3', module docstring).
    False sends the read through the usual rules 3-4."""
    units = _source_units(barrier, rules)
    group = barrier.args.get("group")
    keys = group.expressions if group is not None else []
    if units is None or len(keys) != 1 or not isinstance(keys[0], exp.Column) \
            or any(group.args.get(a) for a in ("rollup", "cube", "grouping_sets")):
        return False
    key = keys[0]
    grouped = key.table or (alias if len(units) == 1 else "")
    if units.get(grouped) is None or key.name != units[grouped] \
            or not _unit_linked(barrier, units, alias, grouped):
        return False
    for item in barrier.expressions:
        found = _interval(item.this if isinstance(item, exp.Alias) else item)
        if found is not None and not all(math.isfinite(v) for v in found):
            return False
    # A unit's own rows only, so MIN and MAX of them are one unit's values too.
    _check_barrier(barrier, name, (*allowed, exp.Min, exp.Max))
    return True


def _source_units(select: exp.Select, rules: OutgoingRules) -> dict[str, str | None] | None:
    """The unit column of every source of ``select`` by alias (None: a public table), or None
    when a source is not a base table or a join is not an inner join with ON."""
    sources = [select.args["from_"].this] if select.args.get("from_") else []
    for join in select.args.get("joins") or []:
        if join.side or (join.kind or "INNER").upper() != "INNER" or join.args.get("on") is None:
            return None
        sources.append(join.this)
    units: dict[str, str | None] = {}
    for source in sources:
        if not isinstance(source, exp.Table):
            return None
        declared = _declared(source, rules)
        spec = rules.private.get(declared)
        units[source.alias_or_name] = spec.unit if spec is not None else None
    return units


def _unit_linked(select: exp.Select, units: dict[str, str | None], start: str,
                 goal: str) -> bool:
    """Whether ``start`` reaches ``goal`` through ON equalities ``a.unit_a = b.unit_b``."""
    edges: dict[str, set[str]] = {}
    for join in select.args.get("joins") or []:
        for cond in _conjuncts(join.args.get("on")):
            if not isinstance(cond, exp.EQ):
                continue
            left, right = cond.this, cond.expression
            if isinstance(left, exp.Column) and isinstance(right, exp.Column) \
                    and left.table in units and right.table in units \
                    and units[left.table] is not None and left.name == units[left.table] \
                    and units[right.table] is not None and right.name == units[right.table]:
                edges.setdefault(left.table, set()).add(right.table)
                edges.setdefault(right.table, set()).add(left.table)
    seen, todo = {start}, [start]
    while todo:
        for nxt in edges.get(todo.pop(), set()) - seen:
            seen.add(nxt)
            todo.append(nxt)
    return goal in seen


def _above_per_person(chain: list[exp.Select], name: str,
                      allowed: tuple[type[exp.Expr], ...]) -> exp.Select:
    """The aggregation over the per-person rows (the barrier rule 5 checks): reached through
    FROM only, by SELECTs that neither join, nor drop rows by their neighbours (LIMIT,
    DISTINCT, windows), nor read anything else."""
    for below, select in itertools.pairwise(chain):
        holder = below.parent
        if not isinstance(holder, exp.Subquery) or not isinstance(holder.parent, exp.From) \
                or holder.parent.parent is not select:
            raise Refused(f"the per-person rows of '{name}' are read other than as a FROM")
        if select.args.get("joins"):
            raise Refused(f"the per-person rows of '{name}' are joined (a person could give "
                          "several rows)")
        for arg in ("expressions", "where", "group"):
            value = select.args.get(arg)
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, exp.Expr) and item.find(exp.Select) is not None:
                    raise Refused(f"the SELECT over the per-person rows of '{name}' has a "
                                  f"subquery in {arg}")
        if _aggregates(select):
            _check_barrier(select, name, allowed)
            return select
        for arg in _FORBIDDEN_IN_BARRIER:
            if select.args.get(arg):
                raise Refused(f"the per-person rows of '{name}' go through {arg.upper()}")
        if any(isinstance(n, exp.Window) for item in select.expressions for n in _local(item)):
            raise Refused(f"the per-person rows of '{name}' go through a window function")
    raise Refused(f"the per-person rows of '{name}' are read outside any aggregation")


_Interval = tuple[float, float]


def _interval(node: exp.Expr) -> _Interval | None:
    """Values ``node`` can take, whatever its columns and aggregates hold (-inf..inf unless
    literals bound it); None: always NULL.  LEAST and GREATEST take their bound from a literal
    argument only: Postgres skips NULL arguments, so another argument may not bind."""
    if isinstance(node, exp.Paren):
        return _interval(node.this)
    if isinstance(node, exp.Null):
        return None
    constant = _constant(node)
    if constant is not None:
        return (constant, constant)
    if isinstance(node, exp.Cast) and node.to.is_type(*exp.DataType.NUMERIC_TYPES):
        inner = _interval(node.this)
        if inner is not None and node.to.is_type(*exp.DataType.INTEGER_TYPES) \
                and all(math.isfinite(v) for v in inner):
            return (math.floor(inner[0]), math.ceil(inner[1]))
        return inner
    if isinstance(node, exp.Least | exp.Greatest):
        args = [node.this, *node.expressions]
        parts = [p for p in (_interval(a) for a in args) if p is not None]
        if not parts:
            return None
        literal = [c for c in (_constant(a) for a in args) if c is not None]
        if isinstance(node, exp.Least):
            return (min(p[0] for p in parts), min([*literal, max(p[1] for p in parts)]))
        return (max([*literal, min(p[0] for p in parts)]), max(p[1] for p in parts))
    if isinstance(node, exp.Case):
        branches = [i.args.get("true") for i in node.args.get("ifs") or []]
        branches.append(node.args.get("default") or exp.Null())
        parts = [p for p in (_interval(b) for b in branches if b is not None) if p is not None]
        if not parts:
            return None
        return (min(p[0] for p in parts), max(p[1] for p in parts))
    return (-math.inf, math.inf)


def _constant(node: exp.Expr) -> float | None:
    """The value of a numeric literal (negated, parenthesised or cast), else None."""
    if isinstance(node, exp.Paren | exp.Cast):
        if isinstance(node, exp.Cast) and not node.to.is_type(*exp.DataType.NUMERIC_TYPES):
            return None
        return _constant(node.this)
    if isinstance(node, exp.Neg):
        inner = _constant(node.this)
        return None if inner is None else -inner
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return float(node.this)
        except ValueError:
            return None
    return None


def _select_ancestors(node: exp.Expr) -> list[exp.Select]:
    out = []
    parent = node.parent
    while parent is not None:
        if isinstance(parent, exp.Select):
            out.append(parent)
        parent = parent.parent
    return out


def _local(node: exp.Expr) -> Iterator[exp.Expr]:
    """The nodes of ``node`` not inside a nested SELECT, in pre-order.

    With an explicit stack: a recursive generator passes every node up through each level
    above it, quadratic on the deep noise expressions of the proxy's own statements."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        children = [c for c in current.iter_expressions()
                    if not isinstance(c, exp.Select | exp.Subquery)]
        stack.extend(reversed(children))


def _plain_aggregates(node: exp.Expr) -> list[exp.Expr]:
    return [n for n in _local(node) if isinstance(n, exp.AggFunc)
            and not isinstance(n.parent, exp.Window)]


def _aggregates(select: exp.Select) -> bool:
    return select.args.get("group") is not None or any(
        _plain_aggregates(p) for p in select.expressions)


def _check_barrier(barrier: exp.Select, name: str, allowed: tuple[type[exp.Expr], ...]) -> None:
    for arg in _FORBIDDEN_IN_BARRIER:
        if barrier.args.get(arg):
            raise Refused(f"the aggregation over '{name}' has {arg.upper()}")
    for arg in ("expressions", "where", "group"):
        value = barrier.args.get(arg)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, exp.Expr) and item.find(exp.Select) is not None:
                raise Refused(f"the aggregation over '{name}' has a subquery in {arg}")
    group = barrier.args.get("group")
    keys: set[str] | None = None  # the GROUP BY texts, rendered only when an output needs them
    for item in barrier.expressions:
        value = item.this if isinstance(item, exp.Alias) else item
        refusal = _aggregated_output(value, name, allowed)
        if refusal is None:
            continue
        # A group key passes whatever it reads.  Rendering every output to compare texts cost
        # most of the check on the noise expressions, which pass as aggregates: only an output
        # that is not one is compared (the same outputs pass as when every one was compared).
        if group is not None:
            if keys is None:
                keys = {k.sql() for k in group.expressions}
            if value.sql() in keys:
                continue
        raise Refused(refusal)


def _aggregated_output(value: exp.Expr, name: str,
                       allowed: tuple[type[exp.Expr], ...]) -> str | None:
    """Why ``value`` is not an allowed aggregate output (None: it reads columns only inside
    allowed aggregates)."""
    aggs = _plain_aggregates(value)
    for agg in aggs:
        if not isinstance(agg, allowed):
            return f"the aggregation over '{name}' uses {agg.sql_name()}"
    # PERCENTILE_CONT(p) WITHIN GROUP (ORDER BY x): x is under the WITHIN GROUP.
    inside = {id(n) for agg in aggs for n in (
        agg.parent if isinstance(agg.parent, exp.WithinGroup) else agg).walk()}
    if any(isinstance(n, exp.Column | exp.Star | exp.Window) and id(n) not in inside
           for n in _local(value)):
        return (f"the aggregation over '{name}' outputs a value that is neither "
                f"aggregated nor a group key ({value.sql()[:80]})")
    return None


def _bounded(chain: list[exp.Select], barrier: int, unit: str, most: float,
             copy: tuple[str, bool] | None = None,
             read: tuple[str, bool] = ("", False)) -> bool:
    """Whether each unit's rows reaching ``barrier`` are bounded (rule 4, module docstring).
    ``copy``: the read is of a ranked copy (or its twin) under (alias, sole source), whose
    direct reader may partition its row numbers by the copy's own ``__chorus_unit_rows`` and
    the unit (``_presorted``); ``read``: the private read's (alias, sole source), whose own
    unit column a GROUP BY must be (``_one_row_per_unit``)."""
    below = chain[: barrier + 1]
    for i, select in enumerate(below):
        for item in select.expressions:
            if not isinstance(item, exp.Alias):
                continue
            if isinstance(item.this, exp.Window) and _numbers_rows(item.this) \
                    and (_partitioned_by(item.this, unit)
                         or (i == 0 and copy is not None
                             and _presorted(item.this, unit, _owned_by(*copy)))) and any(
                        _rank_filter(s.args.get("where"), item.alias, most)
                        for s in below[i + 1:]):
                return True
            if i == 0 and copy is not None and _streamed_numbering(select, item.this, most,
                                                                   *copy) and any(
                    _flag_filter(s.args.get("where"), item.alias) for s in below[1:]):
                return True
            if any(_weight(d, unit, copy=None) for d in _local(item.this)
                   if isinstance(d, exp.Div | exp.Case)):
                # Each unit's rows weigh 1 in all (value histograms), or one of them is marked
                # (cap histograms): bounded only when the barrier sums those weights and
                # nothing else.
                return _sums_of_weights(chain, barrier, unit, copy=None)
        group = select.args.get("group")
        if group is not None:
            # Grouped by the unit, then only counted: each unit adds 1 to one bin above.
            alone = _one_row_per_unit(chain, i, unit, *read)
            above = chain[alone + 1:] if alone is not None else []
            if above and all(isinstance(a, exp.Count) for s in above
                             for p in s.expressions for a in _plain_aggregates(p)) \
                    and any(_aggregates(s) for s in above) \
                    and _whole_up_to_counts(chain, alone):
                return True
    return False


def _one_row_per_unit(chain: list[exp.Select], level: int, unit: str, alias: str,
                      sole: bool) -> int | None:
    """The level at which the rows of ``chain[level]``, grouped by keys among which the read's
    own unit (``_unit_key``), are one row per unit: the first SELECT from there up grouped by
    that unit alone, every one in between grouped by keys among which it is (so a unit's
    rows stay within its groups), each the only source of the next.  None when there is no
    such level, or a grouping is by ROLLUP, CUBE, GROUPING SETS or WITH TOTALS (which put a
    row in several groups).  ``GROUP BY unit, driver`` then ``GROUP BY unit`` (distinct
    drivers per unit) is one row per unit; ``GROUP BY unit, driver`` alone is one per pair."""
    while level < len(chain):
        group = chain[level].args.get("group")
        if group is None or any(group.args.get(arg) for arg in ("grouping_sets", "cube",
                                                                 "rollup", "totals")) \
                or not any(_unit_key(k, unit, chain, level, alias, sole)
                           for k in group.expressions):
            return None
        if len(group.expressions) == 1:
            return level
        if level + 1 < len(chain) and not _read_whole_by(chain[level], chain[level + 1]):
            return None
        level += 1
    return None


def _whole_up_to_counts(chain: list[exp.Select], level: int | None) -> bool:
    """Whether, from ``chain[level]`` up to the last SELECT that aggregates, each is the only
    source of the next (no join above that could repeat a unit's row)."""
    if level is None:
        return False
    last = max(j for j, s in enumerate(chain) if _aggregates(s))
    return all(_read_whole_by(chain[j], chain[j + 1]) for j in range(level, last))


def _unit_key(key: exp.Expr, unit: str, chain: list[exp.Select], level: int, alias: str,
              sole: bool) -> bool:
    """Whether the GROUP BY key ``key`` of ``chain[level]`` is the read's own unit column,
    under its name (``_own_unit``) or another given to it below (``t.rider_id AS u``, traced
    by ``_origin``)."""
    if not isinstance(key, exp.Column):
        return False
    if key.name == unit and _own_unit(key, unit, chain, level, alias, sole):
        return True
    if level == 0:
        return False
    origin = _origin(key.name, chain, level)
    if origin is None or origin[0] < 0:
        return False
    value = origin[1]
    return isinstance(value, exp.Column) and _unit_key(value, unit, chain, origin[0], alias,
                                                       sole)


def _numbers_rows(window: exp.Window) -> bool:
    """Whether ``window`` numbers the rows of each partition 1, 2, .., n once each, so that
    ``<= k`` keeps k of them at most: ``ROW_NUMBER()`` in any order, or the running count
    ``COUNT(*) OVER (... ORDER BY __chorus_rank ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT
    ROW)`` (``rewriters.contribution.kept_rank``), the frame exactly that and nothing
    excluded: a count of the rows from the partition's first to the current one is its
    position.  Not COUNT(x) (NULLs are not counted: rows after one would share its count),
    not COUNT(DISTINCT) or a FILTER (the same), not a RANGE or GROUPS frame (peers counted
    together: ties share a number), not another start or end (a frame of the last rows alone
    counts up to a constant), not EXCLUDE (the current row left out: the first k + 1 rows
    count <= k).  Ordered by one column named as the stored rank: the rows a unit keeps are
    its first k in the copy's random order."""
    function = window.this
    if isinstance(function, exp.RowNumber):
        return True
    spec = window.args.get("spec")
    order = window.args.get("order")
    keys = order.expressions if order is not None else []
    return isinstance(function, exp.Count) and isinstance(function.this, exp.Star) \
        and not function.args.get("expressions") and spec is not None \
        and spec.args.get("kind") == "ROWS" and spec.args.get("start") == "UNBOUNDED" \
        and spec.args.get("start_side") == "PRECEDING" \
        and spec.args.get("end") == "CURRENT ROW" and not spec.args.get("end_side") \
        and not spec.args.get("exclude") and len(keys) == 1 \
        and isinstance(keys[0].this, exp.Column) and keys[0].this.name == _STORED_RANK


def _streamed_numbering(select: exp.Select, value: exp.Expr, most: float, alias: str,
                        sole: bool) -> bool:
    """Whether ``value``, an output of ``select`` (the direct reader of a ranked copy or its
    twin ``alias``, its only source when ``sole``), is the streamed flag of
    ``rewriters.contribution.streamed_rank``, exactly::

        CASE WHEN a.__chorus_pos <= LAG(a.__chorus_pos, 1[, literal]) OVER () THEN ERROR(..)
             ELSE LAG(a.__chorus_run, k[, literal]) OVER () <> a.__chorus_run END

    with k an int literal at most ``most``, and no other window in ``select``: TRUE on at most
    the first k rows of each unit, or the statement fails.  The LAGs are of one window,
    ``OVER ()``, one sequence of the rows; the WHEN fails the statement unless the copy's
    positions (distinct, >= 1, in the order unit row count, unit, stored rank; a month
    twin's in the order month, then those, and it is read one month at a time:
    ``_one_month``) strictly grow along it, so each unit's rows are one run there, and every
    row of a unit carries its unit's number ``__chorus_run`` (the position of its first row in
    the twin: one per unit, distinct between units).  A row whose row k places
    before has the same number is past its run's k-th row: FALSE.  (A missing row reads the
    default: were it the run's number, the row is dropped, never kept.)  A LAG of another
    offset than 1 in the check compares only some pairs; one over a partition or an order is
    another sequence than the others'; another column than the copy's own position is in no
    known order, another than its run number numbers no runs; a LAG back more than the cap
    keeps more than the cap of a run (refused)."""
    windows = [w for e in select.expressions for w in e.find_all(exp.Window)]
    if not isinstance(value, exp.Case) or value.this is not None or len(windows) != 2:
        return False
    ifs = value.args.get("ifs") or []
    default = value.args.get("default")
    if len(ifs) != 1 or not isinstance(default, exp.NEQ):
        return False

    def own(node: exp.Expr | None, name: str) -> bool:
        return isinstance(node, exp.Column) and node.name == name \
            and (node.table == alias or (sole and not node.table))

    def lag(node: exp.Expr | None, name: str) -> exp.Lag | None:
        if not isinstance(node, exp.Window) or any(
                node.args.get(a) for a in ("partition_by", "order", "spec", "alias")):
            return None
        function = node.this
        if not isinstance(function, exp.Lag) or not own(function.this, name):
            return None
        offset = function.args.get("offset")
        fallback = function.args.get("default")
        if fallback is not None and not isinstance(fallback, exp.Literal):
            return None
        return function if isinstance(offset, exp.Literal) and offset.is_int else None

    check = ifs[0]
    test = check.this
    error = check.args.get("true")
    previous = lag(test.expression, _POSITION) if isinstance(test, exp.LTE) else None
    if previous is None or not own(test.this, _POSITION) \
            or int(previous.args["offset"].this) != 1 \
            or not (isinstance(error, exp.Anonymous) and error.name.upper() == "ERROR"):
        return False
    back = lag(default.this, _RUN)
    return back is not None and own(default.expression, _RUN) \
        and _int_at_most(back.args["offset"], most)


def _flag_filter(where: exp.Expr | None, flag: str) -> bool:
    """Whether WHERE ANDs the column ``flag`` itself (TRUE rows only)."""
    return any(isinstance(c, exp.Column) and c.name == flag for c in _conjuncts(where))


def _sums_of_weights(chain: list[exp.Select], barrier: int, unit: str,
                     copy: Callable[[exp.Expr], bool] | None) -> bool:
    """Whether every aggregate of the barrier ``chain[barrier]`` is a SUM of a column that is,
    down the chain of FROM subqueries (each read whole: no join that could repeat a row), a
    weight: ``1 / COUNT(...) OVER (PARTITION BY unit)`` (with ``copy``, which tells a column
    of the ranked copy read by the reader: or ``1 / __chorus_unit_rows`` of it), a mark of one
    row per unit (``_mark``), or a CASE whose every branch is such a weight or NULL.  A unit's
    rows then add at most 1 to each sum in all; a SUM of anything else beside the weights (a
    value, a bin key) would not be bounded by them."""
    aggregates = [a for item in chain[barrier].expressions for a in _plain_aggregates(item)]
    if not aggregates:
        return False
    for aggregate in aggregates:
        if not isinstance(aggregate, exp.Sum) or not isinstance(aggregate.this, exp.Column):
            return False
        name, level = aggregate.this.name, barrier - 1
        while True:
            if level < 0 or not _read_whole_by(chain[level], chain[level + 1]):
                return False
            item = next((e for e in chain[level].expressions if e.alias_or_name == name), None)
            if item is None:
                return False
            value = item.this if isinstance(item, exp.Alias) else item
            if isinstance(value, exp.Column):  # passed through: look one level down
                name, level = value.name, level - 1
                continue
            if not _weight(value, unit, copy):
                return False
            break
    return True


def _read_whole_by(inner: exp.Select, outer: exp.Select) -> bool:
    """Whether ``outer`` reads ``inner`` as its only FROM source, without joins."""
    holder = inner.parent
    return (isinstance(holder, exp.Subquery) and isinstance(holder.parent, exp.From)
            and holder.parent.parent is outer and not outer.args.get("joins"))


def _weight(value: exp.Expr, unit: str, copy: Callable[[exp.Expr], bool] | None) -> bool:
    """Whether ``value`` is a weight (``_sums_of_weights``)."""
    if isinstance(value, exp.Paren):
        return _weight(value.this, unit, copy)
    if _mark(value, unit, copy):
        return True
    if isinstance(value, exp.Case):
        branches = [i.args.get("true") for i in value.args.get("ifs") or []]
        branches.append(value.args.get("default"))
        return all(b is None or isinstance(b, exp.Null) or _weight(b, unit, copy)
                   for b in branches)
    if not isinstance(value, exp.Div) or _constant(value.this) != 1:
        return False
    return _per_unit(value.expression, unit, copy, exp.Count, _UNIT_ROWS)


def _mark(value: exp.Expr, unit: str, copy: Callable[[exp.Expr], bool] | None) -> bool:
    """Whether ``value`` is ``CASE WHEN n = 1 THEN 1 ELSE 0 END`` (ELSE 0, NULL or none) where
    n numbers each unit's rows 1, 2, ... once each, so exactly one row of a unit is marked:
    ``ROW_NUMBER() OVER (PARTITION BY unit ...)`` (the unit alone: more columns would mark a
    row per sub-partition), or, with ``copy``, a ranked copy's ``__chorus_rank`` (1..n_u, each
    once per unit), a column ``copy`` says is the copy's, read by its direct reader.

    Or, with ``copy``, ``CASE WHEN r = MIN(r) OVER (PARTITION BY unit) THEN 1 ELSE 0 END``, r
    the copy's own ``__chorus_rank`` both times (``_least_rank``): the ranks of a unit's rows
    are distinct, so of the rows the reader keeps exactly one holds their least."""
    if not isinstance(value, exp.Case) or value.this is not None:
        return False
    ifs = value.args.get("ifs") or []
    default = value.args.get("default")
    if len(ifs) != 1 or _constant(ifs[0].args.get("true")) != 1 or not (
            default is None or isinstance(default, exp.Null) or _constant(default) == 0):
        return False
    test = ifs[0].this
    if not isinstance(test, exp.EQ):
        return False
    if copy is not None and _least_rank(test, unit, copy):
        return True
    if not isinstance(test.expression, exp.Literal) or not test.expression.is_int \
            or _constant(test.expression) != 1:
        return False
    return _per_unit(test.this, unit, copy, exp.RowNumber, _STORED_RANK)


def _least_rank(test: exp.EQ, unit: str, copy: Callable[[exp.Expr], bool]) -> bool:
    """Whether ``test`` is ``r = MIN(r) OVER (PARTITION BY unit)`` (or the copy's presorted
    partition, ``_partition_of``), both r the copy's own ``__chorus_rank`` (``copy`` says
    which columns are), the window over the whole partition: no ORDER BY, no frame (a running
    MIN in another order than the rank's would be met anew by every row that lowers it)."""
    rank, least = test.this, test.expression
    return _own_rank(rank, copy) and isinstance(least, exp.Window) \
        and isinstance(least.this, exp.Min) and _own_rank(least.this.this, copy) \
        and not (least.args.get("order") or least.args.get("spec")) \
        and _partition_of(least, unit, copy)


def _own_rank(node: exp.Expr, copy: Callable[[exp.Expr], bool]) -> bool:
    """Whether ``node`` is the ranked copy's own ``__chorus_rank`` column."""
    return isinstance(node, exp.Column) and node.name == _STORED_RANK and copy(node)


def _partition_of(window: exp.Window, unit: str, copy: Callable[[exp.Expr], bool] | None
                  ) -> bool:
    """Whether ``window`` is partitioned by the unit alone, or, with ``copy``, by the copy's
    own ``__chorus_unit_rows`` then the unit (the same partitions: ``_presorted``)."""
    return _partitioned_by(window, unit) or (copy is not None and _presorted(window, unit, copy))


def _per_unit(node: exp.Expr, unit: str, copy: Callable[[exp.Expr], bool] | None,
              function: type[exp.Expr], stored: str) -> bool:
    """Whether ``node`` is ``function`` over a window partitioned by the unit alone (with
    ``copy``, or by the copy's own unit row count then the unit), or, with ``copy``, the ranked
    copy's own column ``stored`` that holds the same per unit.

    A COUNT (a weight's denominator) must count the whole partition: no ORDER BY and no
    frame.  ``COUNT(*) OVER (PARTITION BY unit ORDER BY x)`` is a running count 1, 2, .., n,
    whose weights 1, 1/2, .., 1/n add up to the harmonic number H_n ~ ln n, not 1: the
    histogram's sensitivity would grow with the unit's rows.  (ROW_NUMBER numbers each row
    once in any order, so its one row numbered 1 is a mark however it is ordered.)"""
    if isinstance(node, exp.Window):
        whole = not (node.args.get("order") or node.args.get("spec")) \
            or function is not exp.Count
        return isinstance(node.this, function) and _partition_of(node, unit, copy) and whole
    return copy is not None and copy(node) and isinstance(node, exp.Column) \
        and node.name == stored


def _stored_weights(chain: list[exp.Select], barrier: int, alias: str, sole: bool,
                    unit: str | None) -> bool:
    """Whether the direct reader of a ranked copy weighs rows by ``1 / alias.__chorus_unit_rows``
    (the stored count of the unit's rows in the copy: a unit's rows weigh at most 1 in all,
    whatever the filter keeps) or marks its rank-1 rows (``CASE WHEN alias.__chorus_rank = 1
    THEN 1 ELSE 0 END``: one row per unit at most, whatever the filter keeps), and the barrier
    only sums such weights (a COUNT there would count the rows themselves): the selection
    histograms over the stored counts (``rewriters.selection.choice_histogram``)."""
    own = _owned_by(alias, sole)  # a column of this very copy, read by this SELECT
    if unit is None:
        return False
    weighted = any(_weight(d, unit, own) for item in chain[0].expressions
                   for d in _local(item) if isinstance(d, exp.Div | exp.Case))
    return weighted and _sums_of_weights(chain, barrier, unit, own)


def _copy_capped(where: exp.Expr | None, alias: str, sole: bool, most: float) -> bool:
    """Whether WHERE ANDs ``alias.<column> <= <int>`` (the int at most ``most``) for a column
    of a ranked copy that caps each unit's rows at that int: ``__chorus_unit_rows`` (only the
    units with at most that many rows in all: the light units) or ``__chorus_rank`` (each
    unit's rows carry the ranks 1..n_u once each, ``rewriters.contribution.ranked_table``:
    at most that many pass)."""
    return any(isinstance(c, exp.LTE) and isinstance(c.this, exp.Column)
               and c.this.name in (_UNIT_ROWS, _STORED_RANK)
               and (c.this.table == alias or (sole and not c.this.table))
               and _int_at_most(c.expression, most) for c in _conjuncts(where))


def _int_at_most(node: exp.Expr, most: float) -> bool:
    """Whether ``node`` is an integer literal at most ``most`` (a row cap the noise allows)."""
    return isinstance(node, exp.Literal) and node.is_int and int(node.this) <= most


def _partitioned_by(window: exp.Window, unit: str) -> bool:
    """Whether ``window`` is partitioned by the unit column alone: one more column (the unit
    and a row id, say) would rank or weigh each unit's rows per sub-partition, k rows or a
    weight of 1 per sub-partition, unbounded per unit."""
    parts = window.args.get("partition_by") or []
    return len(parts) == 1 and isinstance(parts[0], exp.Column) and parts[0].name == unit


def _presorted(window: exp.Window, unit: str, copy: Callable[[exp.Expr], bool]) -> bool:
    """Whether ``window``, in the direct reader of a ranked copy (or its twin), is partitioned
    by that copy's ``__chorus_unit_rows`` (a column ``copy`` says is the copy's own) then the
    unit, nothing else (``rewriters.contribution.presorted_pays``).  The copy stores each
    unit's count of rows on every row of the unit (``COUNT(*) OVER (PARTITION BY unit)`` when
    it is built), so the partitions are the units' rows exactly, as by the unit alone.  A count
    from anywhere else (another relation, a derived column) could differ between a unit's rows
    and is refused."""
    parts = window.args.get("partition_by") or []
    if len(parts) != 2 or not all(isinstance(p, exp.Column) for p in parts):
        return False
    size, by = parts
    return size.name == _UNIT_ROWS and copy(size) and by.name == unit


def _owned_by(alias: str, sole: bool) -> Callable[[exp.Expr], bool]:
    """Whether a column is the ranked copy's own, read by its direct reader as ``alias``
    (``sole``: its only source, so an unqualified column is the copy's too)."""
    def own(column: exp.Expr) -> bool:
        return isinstance(column, exp.Column) and (column.table == alias
                                                   or (sole and not column.table))
    return own


def _foreign_unit(chain: list[exp.Select], barrier: int, unit: str, alias: str,
                  sole: bool) -> str | None:
    """The first column named ``unit`` in a window's PARTITION BY in the SELECTs from a
    private read's direct reader up to its barrier that is not the read's own unit column
    (``_own_unit``), as SQL; None when there is none.

    The bounding rules (rule 4, 4'') recognise a window's unit by its column's name: a column
    of that name that is something else (another source's column of a join, an alias over
    another expression, ``t.fare AS rider_id``) would split a unit's rows over several
    partitions, each bounded, the unit not.  (A GROUP BY bounds only through
    ``_one_row_per_unit``, which traces its key itself: the barrier's own GROUP BY keys are
    the query's groups, released by their own rules.)"""
    for level in range(barrier + 1):
        keys: list[exp.Expr] = []
        for node in _local(chain[level]):
            if isinstance(node, exp.Window):
                keys += node.args.get("partition_by") or []
        for key in keys:
            for column in ([key] if isinstance(key, exp.Column) else key.find_all(exp.Column)):
                if column.name == unit and not _own_unit(column, unit, chain, level, alias,
                                                         sole):
                    return column.sql()
    return None


def _own_unit(column: exp.Column, unit: str, chain: list[exp.Select], level: int, alias: str,
              sole: bool) -> bool:
    """Whether ``column`` (named ``unit``, in ``chain[level]``) is the private read's own unit
    column: in its direct reader (level 0) a column of the read (``alias``, or unqualified
    when it is the reader's only source); above, a name that comes down unchanged, through
    SELECTs each the only source of the next (``_origin``), to such a column or to the
    reader's star over the read alone."""
    if level == 0:
        return _owned_by(alias, sole)(column)
    origin = _origin(unit, chain, level)
    if origin is None:
        return False
    at, value = origin
    if at >= 0:
        return isinstance(value, exp.Column) and value.name == unit \
            and _own_unit(value, unit, chain, at, alias, sole)
    # Through stars down to the reader: each of its stars must be the read's (``t.*``, or a
    # bare ``*`` over the read alone).
    return all((isinstance(item, exp.Star) and sole)
               or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
                   and item.table == alias)
               for item in chain[0].expressions if _is_star(item))


def _conjuncts(node: exp.Expr | None) -> list[exp.Expr]:
    if node is None:
        return []
    if isinstance(node, exp.Where | exp.Paren):
        return _conjuncts(node.this)
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


def _rank_filter(where: exp.Expr | None, rank: str, most: float) -> bool:
    """Whether WHERE ANDs ``rank <= k``, k an int at most ``most``."""
    return any(isinstance(c, exp.LTE) and isinstance(c.this, exp.Column) and c.this.name == rank
               and _int_at_most(c.expression, most) for c in _conjuncts(where))


def _restricted(where: exp.Expr | None, alias: str, column: str, sole: bool) -> bool:
    """Whether WHERE ANDs a literal window [lo, hi) of ``alias.column`` (or an OR of them);
    ``sole``: the table is the SELECT's only source, so a bare ``column`` is its column."""
    conjuncts = _conjuncts(where)
    if _window(conjuncts, alias, column, sole):
        return True
    for c in conjuncts:
        inner = c.this if isinstance(c, exp.Paren) else c
        if isinstance(inner, exp.Or):
            alternatives = _disjuncts(inner)
            if alternatives and all(_window(_conjuncts(a), alias, column, sole)
                                    for a in alternatives):
                return True
    return False


def _one_month(where: exp.Expr | None, alias: str, sole: bool) -> bool:
    """Whether WHERE ANDs ``alias.__chorus_month = <int literal>``: one month of a month twin.
    The twin holds each unit's rows of one month as one run, in the order its positions
    number (``rewriters.contribution.month_ordered``); over several months a unit has a run
    in each, so a streamed numbering (``_streamed_numbering``) would keep k rows of every
    one of them."""
    def is_month(n: exp.Expr) -> bool:
        return isinstance(n, exp.Column) and n.name == _MONTH \
            and (n.table == alias or (sole and not n.table))

    return any(isinstance(c, exp.EQ) and (
        (is_month(c.this) and isinstance(c.expression, exp.Literal) and c.expression.is_int)
        or (is_month(c.expression) and isinstance(c.this, exp.Literal) and c.this.is_int))
        for c in _conjuncts(where))


def _disjuncts(node: exp.Expr) -> list[exp.Expr]:
    if isinstance(node, exp.Paren):
        return _disjuncts(node.this)
    if isinstance(node, exp.Or):
        return _disjuncts(node.this) + _disjuncts(node.expression)
    return [node]


def _window(conjuncts: list[exp.Expr], alias: str, column: str, sole: bool) -> bool:
    def is_col(n: exp.Expr) -> bool:
        return isinstance(n, exp.Column) and n.name == column and (
            n.table == alias or (sole and not n.table))

    def is_lit(n: exp.Expr) -> bool:
        return isinstance(n, exp.Literal) or (isinstance(n, exp.Cast)
                                              and isinstance(n.this, exp.Literal))

    low = any(isinstance(c, exp.LTE) and is_lit(c.this) and is_col(c.expression)
              for c in conjuncts)
    high = any(isinstance(c, exp.LT) and is_col(c.this) and is_lit(c.expression)
               for c in conjuncts)
    return low and high


# -- 5. noise --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Measured:
    """The aggregations of private rows under a statement's noise: their barriers (one, or a
    ranked copy's parts that ``_combination`` adds up), each one's private reads by
    ``id(barrier)``, and the ``id`` of every read under a per-person barrier (rule 3')."""

    barriers: list[exp.Select]
    reads: Mapping[int, list[exp.Table]]
    per_person: set[int]


def _check_noise(tree: exp.Select, measured: exp.Select, found: _Measured,
                 rules: OutgoingRules) -> None:
    with_ = tree.args.get("with_")
    ctes = with_.expressions if isinstance(with_, exp.With) else []
    if len(ctes) != 1 or ctes[0].alias_or_name != NOISY or not ctes[0].args.get("materialized"):
        raise Refused(f"the answer is not computed from one MATERIALIZED {NOISY}")
    source = tree.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table) \
            or source.this.name != NOISY or tree.args.get("joins") \
            or source.this.args.get("db") is not None:
        raise Refused(f"the answer reads something other than {NOISY}")
    noisy = ctes[0].this
    outside = [s for s in tree.find_all(exp.Select) if s is not tree
               and not any(a is noisy for a in [s, *_select_ancestors(s)])]
    if outside:
        raise Refused("the answer has a subquery outside the noise")
    if not isinstance(noisy, exp.Select) or any(
            noisy.args.get(a) for a in ("joins", "where", "group", "having", "with_")):
        raise Refused(f"{NOISY} is not a plain projection")
    inner = noisy.args["from_"].this if noisy.args.get("from_") else None
    if not isinstance(inner, exp.Subquery) or inner.alias != EXACT \
            or not isinstance(inner.this, exp.Select):
        raise Refused(f"{NOISY} does not read ({EXACT})")
    exact = inner.this
    if _released_empty(exact, measured):
        return  # WHERE FALSE over the aggregation: no row reaches the noise, nothing is released
    if measured is not exact and not _grid_over(exact, measured, rules):
        raise Refused("an aggregation of a private table is not the exact measurements "
                      "the noise reads")
    passed: list[str] = []
    noised: set[str] = set()
    for item in noisy.expressions:
        value = item.this if isinstance(item, exp.Alias) else item
        if any(c.table != EXACT for c in value.find_all(exp.Column)):
            raise Refused(f"{NOISY} reads a column that is not one of {EXACT}")
        if isinstance(value, exp.Column):
            passed.append(value.name)
        elif value.find(exp.Rand) is not None:
            noised.add(item.alias_or_name)
        else:
            raise Refused(f"{NOISY} outputs {item.alias_or_name} without noise")
    from_rows = [k for k in passed if not _public_key(exact, k, rules)]
    if from_rows:
        gates = [c.this.name for c in _conjuncts(tree.args.get("where"))
                 if isinstance(c, exp.GT) and isinstance(c.this, exp.Column)
                 and c.this.name in noised and isinstance(c.expression, exp.Literal)]
        if not gates:
            raise Refused(f"group key {from_rows[0]} comes from private rows but is released "
                          "without the noisy threshold")
        if exact is not measured \
                or not any(_gate_counts_units(noisy, g, measured, found, rules) for g in gates):
            raise Refused(f"group key {from_rows[0]} is released by a threshold on "
                          f"{gates[0]}, which does not count each unit at most once per group")


# -- 5'. the key-release gate ---------------------------------------------------------------
def _gate_counts_units(noisy: exp.Select, gate: str, measured: exp.Select, found: _Measured,
                       rules: OutgoingRules) -> bool:
    """Whether the noisy column ``gate`` of ``noisy`` is noise over one column of the exact
    measurements that counts each unit at most once per group (``_counts_units``)."""
    item = next((i for i in noisy.expressions if i.alias_or_name == gate), None)
    names = {c.name for c in item.find_all(exp.Column)} if item is not None else set()
    return len(names) == 1 and _counts_units(names.pop(), measured, found, rules)


def _counts_units(name: str, measured: exp.Select, found: _Measured,
                  rules: OutgoingRules) -> bool:
    """Whether the output ``name`` of ``measured`` (one aggregation of private rows, or the
    sum of a ranked copy's parts) counts each unit at most once per group, in every
    aggregation it adds up (``_unit_count``).  The key-release threshold is calibrated for
    that count (a new unit adds at most 1 to each of at most D groups): over any other
    column (``COUNT(*)`` of a unit's many rows, a distinct count of another column) one
    unit's rows alone could clear it."""
    total = _output(measured, name)
    if len(found.barriers) == 1:
        counts = [(measured, total)]
    else:  # the ranked copy's parts, summed by _combination: each part's column at its place
        total = total.this if isinstance(total, exp.Cast) else total
        if not isinstance(total, exp.Sum) or not isinstance(total.this, exp.Column):
            return False
        sides = _sides(measured.args["from_"].this.this)
        first = [i.alias_or_name for i in sides[0].expressions] \
            if isinstance(sides[0], exp.Select) else []
        if first.count(total.this.name) != 1:
            return False
        at = first.index(total.this.name)
        counts = [(side, side.expressions[at] if isinstance(side, exp.Select)
                   and at < len(side.expressions) else None) for side in sides]
    for side, value in counts:
        value = value.this if isinstance(value, exp.Alias) else value
        if value is None or not isinstance(side, exp.Select) \
                or not _unit_count(value, side, found, rules):
            return False
    return True


def _output(select: exp.Select, name: str) -> exp.Expr | None:
    """The value of ``select``'s one output named ``name`` (None: none, several, or a star
    that may carry it)."""
    if any(_is_star(i) for i in select.expressions):
        return None
    items = [i for i in select.expressions if i.alias_or_name == name]
    if len(items) != 1:
        return None
    return items[0].this if isinstance(items[0], exp.Alias) else items[0]


def _unit_count(value: exp.Expr, barrier: exp.Select, found: _Measured,
                rules: OutgoingRules) -> bool:
    """Whether ``value``, an output of ``barrier`` (one aggregation of private rows), adds at
    most 1 per unit to each of its groups:

    - ``COUNT(DISTINCT c)``, c the reads' own unit column (``_origins``: its value comes
      unchanged from their unit columns), every other read with a unit joined to them on
      units (``_units_joined``: its rows in a joined row are the same unit's);
    - a grouped twin's count of its marks, grouped by exactly its stored keys
      (``_twin_units``);
    - ``COUNT(*)`` where no read below has a unit (event level: a row is a unit) or every
      read is under a per-person barrier (one row per unit)."""
    reads = found.reads[id(barrier)]
    value = value.this if isinstance(value, exp.Cast) else value
    if isinstance(value, exp.Count) and isinstance(value.this, exp.Star):
        return all(id(t) in found.per_person or _unit_of(t, rules) is None for t in reads)
    if isinstance(value, exp.Count) and isinstance(value.this, exp.Distinct):
        args = value.this.expressions
        if len(args) != 1 or not isinstance(args[0], exp.Column):
            return False
        origins = _origins(args[0], barrier)
        return _units_of(origins, reads, rules) \
            and _units_joined(barrier, [t for t, _ in origins or []], reads, rules)
    return _twin_units(value, barrier, reads, rules)


def _unit_of(table: exp.Table, rules: OutgoingRules) -> str | None:
    """The unit column of the relation ``table`` reads (None: public, event level, or rows of
    several units)."""
    spec = rules.private.get(_declared(table, rules))
    return spec.unit if spec is not None else None


#: Where a column's value comes from: each base table it is read from, with the column's
#: name there (several: the sides of a UNION).
_Origins = list[tuple[exp.Table, str]]


def _units_of(origins: _Origins | None, reads: list[exp.Table], rules: OutgoingRules) -> bool:
    """Whether every origin of a column is the unit column of a read in ``reads``."""
    return bool(origins) and all(any(t is r for r in reads) and _unit_of(t, rules) == name
                                 for t, name in origins or [])


def _origins(column: exp.Column, select: exp.Select) -> _Origins | None:
    """The base tables and their columns whose values ``column`` (in ``select``'s scope) is,
    unchanged: its qualifier's source (or ``select``'s only source), then down through
    subqueries by the output of its name, a plain column (renamed or not), or a star of one
    source, and through each side of a UNION whose sides list the same names (``_names``).
    None when it is anything else: an expression, a name that a star and an explicit output
    may both carry, a star over several sources."""
    sources = _sources(select)
    if column.table:
        source = sources.get(column.table)
    else:
        source = next(iter(sources.values())) if len(sources) == 1 else None
    return _source_origins(source, column.name) if source is not None else None


def _sources(select: exp.Select) -> dict[str, exp.Expr]:
    """``select``'s FROM and JOIN sources by alias."""
    found = [select.args["from_"].this] if select.args.get("from_") else []
    found += [j.this for j in select.args.get("joins") or []]
    return {s.alias_or_name: s for s in found}


def _source_origins(source: exp.Expr, name: str) -> _Origins | None:
    if isinstance(source, exp.Table):
        return [(source, name)]
    if not isinstance(source, exp.Subquery):
        return None
    node = source.this
    sides = _sides(node) if isinstance(node, exp.Union) else [node]
    names = [_names(s) if isinstance(s, exp.Select) else None for s in sides]
    if len(sides) > 1 and (names[0] is None or any(n != names[0] for n in names)):
        return None
    out: _Origins = []
    for side in sides:
        found = _select_origins(side, name) if isinstance(side, exp.Select) else None
        if found is None:
            return None
        out += found
    return out


def _select_origins(select: exp.Select, name: str) -> _Origins | None:
    explicit = [i for i in select.expressions if not _is_star(i) and i.alias_or_name == name]
    stars = [i for i in select.expressions if _is_star(i)]
    if len(explicit) > 1 or (explicit and stars):
        return None
    if explicit:
        value = explicit[0].this if isinstance(explicit[0], exp.Alias) else explicit[0]
        return _origins(value, select) if isinstance(value, exp.Column) else None
    if len(stars) != 1:
        return None
    sources = _sources(select)
    star = stars[0]
    if isinstance(star, exp.Star):
        source = next(iter(sources.values())) if len(sources) == 1 else None
    else:
        source = sources.get(star.table)
    return _source_origins(source, name) if source is not None else None


def _sides(node: exp.Expr) -> list[exp.Expr]:
    """The sides of a chain of set operations, left to right (``node`` itself if none)."""
    if isinstance(node, exp.SetOperation):
        return _sides(node.this) + _sides(node.expression)
    return [node]


def _units_joined(barrier: exp.Select, counted: list[exp.Table], reads: list[exp.Table],
                  rules: OutgoingRules) -> bool:
    """Whether every read below ``barrier`` with a unit, other than the ``counted`` ones, is
    joined to them by ON equalities of unit columns (``_origins``; a chain of them through
    the join's sources) where their sources first meet: a joined row then holds one unit's
    rows only, and a distinct count of the counted unit counts it."""
    others = [t for t in reads if _unit_of(t, rules) is not None
              and not any(t is c for c in counted)]
    for table in others:
        meet = next((s for s in _select_ancestors(counted[0])
                     if any(a is s for a in _select_ancestors(table))), None)
        if meet is None or not meet.args.get("joins"):
            return False
        sources = _sources(meet)
        start = next((a for a, src in sources.items() if _contains(src, counted[0])), None)
        goal = next((a for a, src in sources.items() if _contains(src, table)), None)
        if start is None or goal is None or start == goal:
            return False
        edges: dict[str, set[str]] = {}
        for join in meet.args.get("joins") or []:
            for cond in _conjuncts(join.args.get("on")):
                if not isinstance(cond, exp.EQ):
                    continue
                ends = [cond.this, cond.expression]
                if all(isinstance(e, exp.Column) and e.table in sources
                       and _units_of(_origins(e, meet), reads, rules) for e in ends):
                    edges.setdefault(ends[0].table, set()).add(ends[1].table)
                    edges.setdefault(ends[1].table, set()).add(ends[0].table)
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges.get(todo.pop(), set()) - seen:
                seen.add(nxt)
                todo.append(nxt)
        if goal not in seen:
            return False
    return True


def _contains(node: exp.Expr, inner: exp.Expr | None) -> bool:
    """Whether ``inner`` is ``node`` or lies inside it."""
    while inner is not None:
        if inner is node:
            return True
        inner = inner.parent
    return False


def _twin_units(value: exp.Expr, barrier: exp.Select, reads: list[exp.Table],
                rules: OutgoingRules) -> bool:
    """Whether ``value`` counts a grouped twin's marks (``rewriters.grouped_copy``):
    ``COUNT(CASE WHEN x.__chorus_rank = x.__chorus_gscore THEN x.unit END)`` or
    ``SUM(x.__chorus_gfirst)``, each column's value the twin's own column of that name
    (``_origins``), under a GROUP BY of exactly the twin's stored keys (``_stored_keys``).
    The proxy stores one mark per (unit, group of those keys): the row of least stored rank
    (``__chorus_gscore`` is that rank) or ``__chorus_gfirst = 1``.  Grouped by fewer keys, a
    unit's marks of several stored groups would fall in one group, each counted."""
    if isinstance(value, exp.Sum) and isinstance(value.this, exp.Column):
        origins = _origins(value.this, barrier)
        if origins is None or any(name != _GROUP_FIRST for _, name in origins):
            return False
    elif isinstance(value, exp.Count) and isinstance(value.this, exp.Case):
        ifs = value.this.args.get("ifs") or []
        default = value.this.args.get("default")
        if len(ifs) != 1 or (default is not None and not isinstance(default, exp.Null)):
            return False
        test, unit = ifs[0].this, ifs[0].args.get("true")
        if not isinstance(test, exp.EQ) or not isinstance(unit, exp.Column):
            return False
        origins = _origins(unit, barrier)
        if not _units_of(origins, reads, rules):
            return False
        ranks = [_origins(r, barrier) if isinstance(r, exp.Column) else None
                 for r in (test.this, test.expression)]
        if any(r is None or len(r) != 1 for r in ranks) \
                or sorted(r[0][1] for r in ranks if r) != sorted([_STORED_RANK, _GROUP_SCORE]) \
                or any(r[0][0] is not origins[0][0] for r in ranks if r and origins):
            return False
    else:
        return False
    if len(origins) != 1 or not any(origins[0][0] is r for r in reads):
        return False
    return _stored_keys(barrier, origins[0][0], rules)


def _stored_keys(barrier: exp.Select, twin: exp.Table, rules: OutgoingRules) -> bool:
    """Whether ``twin`` is a grouped twin and ``barrier`` groups by exactly its stored key
    columns, in order: each key's value is the twin's column (``_origins``) and those
    columns' names digest to the one in its name (``_key_digest``)."""
    db = twin.args.get("db")
    group = barrier.args.get("group")
    if db is None or db.name != rules.private_schema or group is None \
            or not _GROUPED_TWIN.fullmatch(twin.name) \
            or any(group.args.get(a) for a in ("rollup", "cube", "grouping_sets", "totals")):
        return False
    names = []
    for key in group.expressions:
        origins = _origins(key, barrier) if isinstance(key, exp.Column) else None
        if origins is None or len(origins) != 1 or origins[0][0] is not twin:
            return False
        names.append(origins[0][1])
    return bool(names) and twin.name.endswith(f"_g{_key_digest(names)}")


def _key_digest(columns: list[str]) -> str:
    """The digest a grouped twin's name carries of its key columns
    (``rewriters.grouped_copy.grouped_name``: the first 8 hex digits of the SHA-256 of the
    names joined by NUL)."""
    return hashlib.sha256("\0".join(columns).encode()).hexdigest()[:8]


def _combination(barriers: list[exp.Select], reads: Mapping[int, list[exp.Table]],
                 rules: OutgoingRules) -> exp.Select:
    """The SELECT ``SELECT keys, SUM(m) ... FROM (B1 UNION ALL B2 [UNION ALL B3]) AS p GROUP
    BY keys`` over exactly the ``barriers``, the per-group aggregates of a ranked copy's parts
    (light and heavy branches, or light, middle and heavy parts:
    ``rewriters.pipeline.combine_branches``): each output a GROUP BY column passed through or
    a SUM of a column (cast or not), nothing else.  A unit's rows feed one part only
    (``_disjoint_parts``), so each sum is that of one aggregation over the union of the
    parts' rows and the stability of each part, k, holds for the sum: were the parts not
    disjoint, a unit could give k rows to each, 2k or 3k in all."""
    if not 2 <= len(barriers) <= 3:
        raise Refused("more than one aggregation of private rows and not a ranked copy's "
                      "parts")
    top = barriers[0].parent
    if not isinstance(top, exp.Union):
        raise Refused("two aggregations of private rows that are not one UNION ALL")
    while isinstance(top.parent, exp.SetOperation):
        top = top.parent
    leaves: list[exp.Expr] = []
    pending: list[exp.Expr] = [top]
    while pending:
        node = pending.pop()
        if isinstance(node, exp.SetOperation):
            if not isinstance(node, exp.Union) or isinstance(node, exp.Intersect | exp.Except) \
                    or node.args.get("distinct"):
                raise Refused("aggregations of private rows that are not one UNION ALL")
            pending += [node.this, node.expression]
        else:
            leaves.append(node)
    if sorted(map(id, leaves)) != sorted(map(id, barriers)):
        raise Refused("aggregations of private rows that are not one UNION ALL")
    holder = top.parent
    if not isinstance(holder, exp.Subquery) or not isinstance(holder.parent, exp.From) \
            or not isinstance(holder.parent.parent, exp.Select):
        raise Refused("the UNION ALL of two aggregations is not read as a FROM")
    combiner = holder.parent.parent
    if any(combiner.args.get(a) for a in ("joins", "where", "with_", *_FORBIDDEN_IN_BARRIER)):
        raise Refused("the sum of two aggregations is not a plain GROUP BY")
    group = combiner.args.get("group")
    if group is not None and (any(group.args.get(a) for a in ("rollup", "cube", "grouping_sets"))
                              or not all(isinstance(k, exp.Column) for k in group.expressions)):
        raise Refused("the sum of two aggregations groups by something other than columns")
    keys = {k.sql() for k in group.expressions} if group is not None else set()
    for item in combiner.expressions:
        value = item.this if isinstance(item, exp.Alias) else item
        if isinstance(value, exp.Column) and value.sql() in keys:
            continue
        total = value.this if isinstance(value, exp.Cast) else value
        if not isinstance(total, exp.Sum) or not isinstance(total.this, exp.Column):
            raise Refused(f"the sum of two aggregations outputs {item.alias_or_name}, neither "
                          "a group key nor a SUM of one of their columns")
    _disjoint_parts([reads[id(b)] for b in barriers], rules)
    return combiner


def _disjoint_parts(parts: list[list[exp.Table]], rules: OutgoingRules) -> None:
    """Refuse unless each part reads one table, the same ranked copy (or its twin), with
    disjoint ranges of
    ``__chorus_unit_rows``: ``<= K`` and ``> K`` ANDed into each reading SELECT's WHERE give
    the range (max of the ``> K``, min of the ``<= K``]; a unit's stored row count
    is the same on all its rows, so its rows pass one part's range only (light ``<= g``,
    middle ``> g AND <= k``, heavy ``> k``; or light ``<= K``, heavy ``> K``).  A part with
    no bound has the whole range and overlaps every other."""
    if any(len(part) != 1 for part in parts):
        raise Refused("a part of the sum of aggregations reads private rows twice")
    tables = [part[0] for part in parts]
    for t in tables:
        db = t.args.get("db")
        if not (db is not None and db.name == rules.private_schema and _RANKED_MARKER in t.name
                and _copy_of(t.name) == _copy_of(tables[0].name)):
            raise Refused("the aggregations do not read one ranked copy")
    ranges = []
    for t in tables:
        below, above = _unit_rows_bounds(t)
        ranges.append((max(above, default=-math.inf), min(below, default=math.inf)))
    ranges.sort()
    # Disjoint, and (as the rewriter writes them) the whole range cut at the parts' Ks: each
    # part's bound below is the previous part's bound above.
    if ranges[0][0] != -math.inf or ranges[-1][1] != math.inf \
            or any(hi != lo for (_, hi), (lo, _) in itertools.pairwise(ranges)):
        raise Refused("the parts of a ranked copy are not disjoint (__chorus_unit_rows "
                      "<= K in one, > K in the next)")


def _copy_occurrences(barrier: exp.Select, tables: list[exp.Table], rules: OutgoingRules,
                      paired: bool) -> None:
    """Refuse unless the reads of each ranked copy below ``barrier`` (one aggregation) make
    occurrences of its table each bounded as a whole: one read bounded by itself (rule 4), or
    the light and heavy branches (or three parts), the sides of one UNION ALL, disjoint
    (``_disjoint_parts``: overlapping ones would give a unit k rows in each, 2k in the one
    occurrence).  A light branch (``__chorus_unit_rows <= K``) is never read alone: the
    rewriter reads it only with its heavy branch (``paired``: each of two aggregations reads
    one branch, which ``_combination`` pairs).  Several occurrences of one copy must be
    distinct sources of one join (a self-join, whose stability the analysis derives from the
    elastic rules, as for the table itself read twice): two occurrences in one source (a
    UNION ALL of two bounded reads, a subquery of the copy in a filter of its own read) would
    give a unit 2k rows where the noise assumes k."""
    copies: dict[str, list[exp.Table]] = {}
    for t in tables:
        db = t.args.get("db")
        if db is not None and db.name == rules.private_schema and _RANKED_MARKER in t.name:
            # A twin holds its copy's very rows: a heavy branch read from it pairs with the
            # copy's light branch, and two bounded reads of copy and twin are two occurrences.
            copies.setdefault(_copy_of(t.name), []).append(t)
    for name, reads in copies.items():
        groups: dict[int, list[exp.Table]] = {}  # by the set operation the read is a side of
        for t in reads:
            union = _set_operation_below(t, barrier)
            groups.setdefault(id(union) if union is not None else id(t), []).append(t)
        for group in groups.values():
            if len(group) > 3:
                raise Refused(f"the ranked copy {name} is read {len(group)} times by one set "
                              "operation")
            if len(group) > 1:
                _disjoint_parts([[t] for t in group], rules)
            elif not paired and _unit_rows_bounds(group[0])[0] \
                    and not _weighed_read(group[0], barrier, rules):
                raise Refused(f"a light branch of the ranked copy {name} (__chorus_unit_rows "
                              "<= K) is read without its heavy branch")
        if len(groups) > 1:
            holders = [_join_source(group[0], barrier) for group in groups.values()]
            if any(h is None for h in holders) \
                    or len({id(h[0]) for h in holders if h is not None}) != 1 \
                    or len({id(h[1]) for h in holders if h is not None}) != len(holders):
                raise Refused(f"the ranked copy {name} is read {len(groups)} times by one "
                              "aggregation, not as distinct sources of one join")


def _weighed_read(table: exp.Table, barrier: exp.Select, rules: OutgoingRules) -> bool:
    """Whether ``barrier``, the aggregation over the read ``table`` of a ranked copy (or its
    twin), sums only per-unit weights and marks of that copy's rows (``_sums_of_weights``: a
    unit's rows add at most 1 to each sum, whichever of them its reader's WHERE keeps).  A
    ``__chorus_unit_rows`` comparison in that WHERE then keeps or drops whole units and bounds
    nothing: not a light branch, but a part of the choices' cells
    (``rewriters.selection.choice_histogram``'s ``part``)."""
    chain = _select_ancestors(table)
    index = next((i for i, s in enumerate(chain) if s is barrier), None)
    unit = rules.private[_declared(table, rules)].unit
    if index is None or unit is None:
        return False
    own = _owned_by(table.alias_or_name, not chain[0].args.get("joins"))
    return _sums_of_weights(chain, index, unit, own)


def _copy_of(name: str) -> str:
    """The ranked copy a relation of the private schema holds the rows of: itself, or the
    copy whose twin (``_u``), month twin (``_m``) or grouped twin (``_g<8 hex>``) it is
    (``_declared`` accepted no other name)."""
    relation = _RANKED_RELATION.fullmatch(name)
    return relation.group(1) if relation else name


def _set_operation_below(table: exp.Table, barrier: exp.Select) -> exp.SetOperation | None:
    """The nearest UNION (INTERSECT, EXCEPT) between ``table`` and ``barrier``, if any, or the
    one it is directly nested in (``P1 UNION ALL P2 UNION ALL P3``: one set operation of
    three sides)."""
    node = table.parent
    while node is not None and node is not barrier:
        if isinstance(node, exp.SetOperation):
            while isinstance(node.parent, exp.SetOperation):
                node = node.parent
            return node
        node = node.parent
    return None


def _join_source(node: exp.Expr, barrier: exp.Select
                 ) -> tuple[exp.Select, exp.From | exp.Join] | None:
    """The nearest SELECT with joins at or below ``barrier`` that reads ``node`` through one
    of its sources, with that source's FROM or JOIN (None: no join above ``node``)."""
    while node is not barrier and node.parent is not None:
        holder = node.parent
        if isinstance(holder, exp.From | exp.Join) and isinstance(holder.parent, exp.Select) \
                and holder.parent.args.get("joins"):
            return holder.parent, holder
        node = holder
    return None


def _unit_rows_bounds(table: exp.Table) -> tuple[set[int], set[int]]:
    """The K of every ``alias.__chorus_unit_rows <= K`` and of every ``> K`` ANDed into the
    WHERE of the SELECT that reads ``table`` (a bare column when it is that SELECT's only
    source)."""
    reader = _select_ancestors(table)[0]
    alias, sole = table.alias_or_name, not reader.args.get("joins")
    below: set[int] = set()
    above: set[int] = set()
    for c in _conjuncts(reader.args.get("where")):
        if isinstance(c, exp.LTE | exp.GT) and isinstance(c.this, exp.Column) \
                and c.this.name == _UNIT_ROWS \
                and (c.this.table == alias or (sole and not c.this.table)) \
                and isinstance(c.expression, exp.Literal) and c.expression.is_int:
            (below if isinstance(c, exp.LTE) else above).add(int(c.expression.this))
    return below, above


def _released_empty(exact: exp.Select, barrier: exp.Select) -> bool:
    """``exact`` is ``SELECT ... FROM (barrier) AS e WHERE FALSE``: the rewriter's form for a
    query whose WHERE left no declared public key (``rewriters.groups.complete_groups``)."""
    source = exact.args["from_"].this if exact.args.get("from_") else None
    where = exact.args.get("where")
    return isinstance(source, exp.Subquery) and source.this is barrier \
        and not exact.args.get("joins") and not exact.args.get("group") \
        and where is not None and isinstance(where.this, exp.Boolean) \
        and where.this.this is False


def _grid_over(exact: exp.Select, barrier: exp.Select, rules: OutgoingRules) -> bool:
    """``exact`` is ``grid LEFT JOIN (barrier) AS e``, the grid made of literal VALUES and
    of reads of public tables."""
    joins = exact.args.get("joins") or []
    if len(joins) != 1 or exact.args.get("where") or exact.args.get("group"):
        return False
    join = joins[0]
    grid = exact.args["from_"].this if exact.args.get("from_") else None
    return (join.side or "").upper() == "LEFT" and isinstance(join.this, exp.Subquery) \
        and join.this.this is barrier and grid is not None and _public_only(grid, rules)


def _public_only(node: exp.Expr, rules: OutgoingRules) -> bool:
    """Whether ``node`` reads no table but public ones (each qualified by the proxy's
    schema: ``_declared`` refuses anything else)."""
    return all(_declared(t, rules) in rules.public for t in node.find_all(exp.Table))


def _public_key(exact: exp.Select, key: str, rules: OutgoingRules) -> bool:
    """Whether output ``key`` of ``exact`` is a column of a source that reads no private
    table (the grid)."""
    item = next((i for i in exact.expressions if i.alias_or_name == key), None)
    value = item.this if isinstance(item, exp.Alias) else item
    if not isinstance(value, exp.Column):
        return False
    sources = [exact.args["from_"].this] if exact.args.get("from_") else []
    sources += [j.this for j in exact.args.get("joins") or []]
    return any(s.alias_or_name == value.table and _public_only(s, rules) for s in sources)


def rules_from_policy(policy: Policy, schema: str | None, private_schema: str) -> OutgoingRules:
    """The verifier's view of ``policy``: public tables, and each private table's unit and
    block columns (a table whose rows belong to several units is read only through its stored
    set, in ``private_schema``, which the rules treat as bounded)."""
    public = frozenset(name for name, tp in policy.tables.items() if tp.public)
    private = {}
    for name, tp in policy.tables.items():
        if tp.public:
            continue
        unit = tp.privacy_unit if isinstance(tp.privacy_unit, str) else None
        private[name] = PrivateTable(unit, tp.block.column if tp.block is not None else None,
                                     tp.contribution_bound if unit is not None else None)
    return OutgoingRules(public, private, schema, private_schema)
