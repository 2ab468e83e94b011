"""Quantiles over joins: when the exponential mechanism's sensitivity is a public constant.

A quantile of a join (``SELECT MEDIAN(t.fare) FROM trips t JOIN cities c ON t.city = c.city``)
is drawn by the exponential mechanism from the histogram of the *join rows*
(``chorus_py.kinds.quantile``).  Its rank utility u(b) = -dist(p n, ranks of bin b) moves by at
most max(p, 1 - p) per join row added or removed (``mechanisms.exponential``), so

    Delta = S * max(p, 1 - p)        (the joint mechanism: 2 S, ``mechanisms.joint_quantiles``)

where S bounds the join rows one person adds or removes.  That S is the join's elastic
stability (``analyses.joins``) at distance k = 0, and it is a *global* bound only when S(k) does
not grow with k and reads no private data:

- private tables joined with public tables on a key: u's <= c bounded rows each meet at most
  mf(b, public) rows of the public table (its max frequency of the join key, public: read from
  the public table or pinned), so S = c * mf(b, public) at every k.  ``trips`` (c = 10) JOIN
  ``cities`` ON city, cities.city unique: S = 10.
- private tables of one privacy unit joined on that unit (``JoinInfo.unit_keyed``): u's join
  rows are the combinations of u's own bounded rows, S = c_1 * c_2 * ... (times the public
  tables' frequencies).  ``trips`` (c = 10) JOIN ``riders`` (c = 1) ON rider_id: S = 10; a
  self-join of trips on rider_id: S = 100.

Every join row of u is added together with u (an inner join of bounded rows is monotone: u's
rows only add pairs, and the bounding of the others' rows does not depend on u, since it is
partitioned by unit), so neighbours differ by at most S rows of the histogram, all added or
all removed: the setting of the single-table proof with k replaced by S.

Otherwise (a max frequency read from a private table, or S(k) growing with k: a self-join on a
non-unit column, two private tables joined on another key) S is local, data-dependent, and the
exponential mechanism has no smooth analogue here: refused, naming what answers it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from analyses.join_groups import stability_degree
from analyses.joins import JoinInfo
from chorus_py.errors import NotSupportedError

_ANSWERS = ("ask COUNT/SUM/AVG over this join (smooth elastic sensitivity), pin the join key's "
            "max_frequency in the policy, join private tables of one privacy unit on that unit, "
            "or opt in to sensitivity sampling: SET chorus.sensitivity = 'sampled' (REST: "
            "\"sensitivity\": \"sampled\")")


def check_quantile_join(join: JoinInfo) -> None:
    """Refuse (free, before anything runs) a join whose rows per person are not bounded by a
    public constant (module docstring)."""
    if join.data_dependent:
        names = ", ".join(m.name for m in join.metrics if m.source == "data")
        raise NotSupportedError(
            "a quantile, MIN or MAX over this join: the join rows one person can change are "
            f"bounded only by max frequencies read from private data ({names}), so the "
            "exponential mechanism's sensitivity would depend on private data",
            hint=_ANSWERS)
    if stability_degree(join) > 0:
        raise NotSupportedError(
            "a quantile, MIN or MAX over this join: the join rows one person can change grow "
            f"with the distance to the data (S(k) = {join.stability.text()}), so no public bound "
            "holds for the exponential mechanism", hint=_ANSWERS)


def join_rows_per_unit(join: JoinInfo, mf: Mapping[str, float]) -> int:
    """S, the most join rows one person adds or removes (module docstring); ``mf`` holds the
    join's max frequencies, all pinned or public (``check_quantile_join`` refused the rest).

    >>> from sqlglot import exp
    >>> from analyses.elastic import Const, Freq, mul
    >>> from analyses.joins import JoinSource
    >>> from chorus_py.policy import TablePolicy
    >>> t = TablePolicy(privacy_unit="rider_id", max_rows_per_unit=10,
    ...                 columns={"rider_id": {"type": "int"}})
    >>> join = JoinInfo(exp.select("1"), (JoinSource("t", "trips", t, 10),),
    ...                 (), mul(Const(10.0), Freq("mf(cities.city)", 0.0)), (), (), False)
    >>> join_rows_per_unit(join, {"mf(cities.city)": 2.0})
    20
    """
    check_quantile_join(join)
    value = join.stability.upper(mf)[0]
    if not math.isfinite(value) or value < 1:
        raise NotSupportedError("a quantile over this join: no finite bound on the join rows "
                                "one person changes", hint=_ANSWERS)
    return math.ceil(value)

