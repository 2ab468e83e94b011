"""How many groups one person's rows of a join reach: for group keys of a join released by a
noisy threshold, and for ``COUNT(DISTINCT unit)`` over a join.

Setting: a *unit-keyed* join (``analyses.joins``): every private occurrence has the same
privacy unit and is joined to the others on it (public tables on anything), e.g. trips t JOIN
riders r ON t.rider_id = r.rider_id, or trips a JOIN trips b ON a.rider_id = b.rider_id.
Adding or removing person u adds or removes exactly the join rows that carry u, each built
from u's own (bounded) rows of every private occurrence and rows of public tables, which never
change; no other join row changes.

D, the most groups one person reaches: the groups of u are the values the keys take on u's
join rows.

- Keys that read private occurrences A only: a key's value is a function of the A-rows of the
  join row, and u has at most c_a bounded rows in occurrence a, so D <= prod over a in A of c_a.
  trips (c = 10) JOIN riders (c = 1) GROUP BY r.signup_year: D = 1; GROUP BY t.city: D = 10; a
  self-join of trips GROUP BY a.city, b.city: D = 100.
- Keys that read a public table too: D <= the number of u's join rows <= S, the join's
  stability, when S is a constant (a unit-keyed join of private tables has S = the product of
  the caps, times the public tables' frequencies, which are public: it does not grow with the
  distance k).  S read from private data would make D data-dependent: refused.

The smaller bound that applies is D.  The key-release gate is ``COUNT(DISTINCT unit)`` per
group: u adds 1 to each of its <= D groups (L1 change D, at most 1 per group), the setting of
``mechanisms.thresholding``, so tau = 1 + b ln(D / delta) with b = D / epsilon_t.  The other
measurements keep the join's elastic bound: u's <= S join rows change the L1 norm of a
count's vector over all groups by <= S, however they are spread over groups (smoothed as for
any join, ``analyses.smoothing``).  ``COUNT(DISTINCT unit)`` as a measurement moves by 1 in each
group u reaches: Delta = 1 without GROUP BY, min(G, D) with G listed public keys, D otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from sqlglot import exp

from analyses.joins import JoinInfo
from chorus_py.errors import NotSupportedError

_FIX = ("group by a column with public_values, a column of a joined public table or a calendar "
        "bucket of the block column (DATE_TRUNC, EXTRACT); or join private tables of one "
        "privacy unit on that unit (e.g. trips t JOIN riders r ON t.rider_id = r.rider_id)")


def check_join_keys(join: JoinInfo, keys: Sequence[exp.Expr], what: str) -> None:
    """Refuse (free, before anything runs) keys of ``join`` whose groups per person cannot be
    bounded by public information (module docstring); ``what`` names the construct."""
    if not join.unit_keyed:
        raise NotSupportedError(
            f"{what} over this join: a person's rows may reach other people's groups, since "
            "the private tables are not all joined on their privacy unit (or are protected at "
            "event level), so no bound on the groups one person reaches holds", hint=_FIX)
    if _private_only(join, keys):
        return
    if join.data_dependent or stability_degree(join) > 0:
        raise NotSupportedError(
            f"{what} over this join: a key reads a public table, so a person's groups are "
            "bounded by their number of join rows, which here depends on private data",
            hint="group by columns of the private tables, or " + _FIX)


def groups_per_unit(join: JoinInfo, keys: Sequence[exp.Expr], mf: Mapping[str, float]) -> int:
    """D, the most groups of ``keys`` one person's join rows reach (module docstring).

    ``mf`` holds the join's max frequencies (public or pinned ones only: ``check_join_keys``
    refused the others).  Raises ValueError on a join ``check_join_keys`` would refuse.

    >>> from analyses.joins import JoinSource
    >>> from analyses.elastic import Const
    >>> from chorus_py.policy import TablePolicy
    >>> cols = {"rider_id": {"type": "int"}}
    >>> t = TablePolicy(privacy_unit="rider_id", max_rows_per_unit=10, columns=cols)
    >>> r = TablePolicy(privacy_unit="rider_id", max_rows_per_unit=1, columns=cols)
    >>> join = JoinInfo(exp.select("1"), (JoinSource("t", "trips", t, 10),
    ...                 JoinSource("r", "riders", r, 1)), (), Const(10.0), (), (), True)
    >>> groups_per_unit(join, [exp.column("signup_year", table="r")], {})
    1
    >>> groups_per_unit(join, [exp.column("city", table="t"), exp.column("year", table="r")], {})
    10
    """
    if not join.unit_keyed:
        raise ValueError("groups per person are bounded only over a unit-keyed join")
    sources = {s.alias: s for s in join.sources}
    bounds = []
    if _private_only(join, keys):
        read = {c.table for key in keys for c in key.find_all(exp.Column)}
        bounds.append(math.prod(sources[a].cap for a in read))
    if not join.data_dependent and stability_degree(join) == 0:
        # S(k) <= its constant upper polynomial at every k: at most that many join rows of u.
        bounds.append(math.ceil(join.stability.upper(mf)[0]))
    if not bounds:
        raise ValueError("no public bound on the groups one person reaches")
    return max(1, min(bounds))


def _private_only(join: JoinInfo, keys: Sequence[exp.Expr]) -> bool:
    private = {s.alias for s in join.private_sources}
    return all(c.table in private for key in keys for c in key.find_all(exp.Column))


def stability_degree(join: JoinInfo) -> int:
    """The degree in k of S's upper polynomial (structural: every frequency taken as 1)."""
    poly = join.stability.upper({leaf.name: 1.0 for leaf in join.stability.leaves()})
    return max((i for i, c in enumerate(poly) if c > 0), default=0)
