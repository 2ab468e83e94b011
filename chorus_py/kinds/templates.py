"""Rewritten SQL as text with holes: a new cap, clipping bounds or epsilon for a query shape
already seen costs a string substitution instead of a rewrite and a sqlglot rendering.

A value that varies from call to call (the row cap k, the groups bound g, the clipping bounds
l and u, the AVG/VARIANCE centre c = (l + u) / 2, the key-release threshold tau and every
mechanism parameter) reaches the SQL only as a literal whose text is a function of the value
alone: ``Literal.number`` for k, g, c and tau, ``rewriters.clipping``'s number for l and u, and
``mechanisms.base.float_literal`` (``'<repr(x)>'``) for mechanism parameters.  Which *structure*
surrounds them depends on a few properties of the values (a centre of 0 drops the subtraction, a
negative bound is a ``Neg`` node, an integral one prints without a fraction, g < k adds the
groups bound, k < limit adds the rank filter on a stored sample): those properties are part of
the template's key (``signature``).

A template is rendered once with random placeholder values of the same signature, then checked:
a second, independent set of placeholders rendered in full must equal the first text with the
second set substituted, character for character, and so must the values of the call that built
it.  The placeholders come from os.urandom, so an analyst cannot plant one; a literal of the
query that happens to equal one would break the check, and the query is then rendered in full
every time.  ``TextTemplate`` (the text cut at its holes) is shared with ``chorus_py.kinds.join``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlglot import exp

from analyses.query import AggregateQuery
from analyses.trees import dialect_named
from mechanisms.planning import NoisePlan, NoiseRequest, ThresholdRequest, plan_noise
from rewriters.clipping import bound_literal, stored_clip  # bound_literal: as clipping prints

# A value that varies, named by where it comes from: ("k",), ("lo", arg), ("m", id, field, sign)..
Source = tuple[Any, ...]


class TextTemplate:
    """A text cut at every occurrence of its holes (whole tokens only): filling is a join."""

    def __init__(self, text: str, holes: Iterable[str]) -> None:
        ordered = sorted(set(holes), key=len, reverse=True)
        if ordered:
            alternatives = "|".join(re.escape(h) for h in ordered)
            # A hole never matches inside a longer number or name ("12" in "0.125" or "x12").
            parts = re.split(rf"(?<![\w.])({alternatives})(?![\w.])", text)
        else:
            parts = [text]
        self._constant = parts[0::2]
        self._holes = parts[1::2]

    def count(self, hole: str) -> int:
        """How often ``hole`` occurs in the text."""
        return self._holes.count(hole)

    def fill(self, texts: Mapping[str, str]) -> str:
        """The text with every hole replaced by ``texts[hole]``."""
        out = [self._constant[0]]
        for hole, after in zip(self._holes, self._constant[1:], strict=True):
            out.append(texts[hole])
            out.append(after)
        return "".join(out)


def _number_text(value: float, dialect: str) -> str:
    """How ``exp.Literal.number(value)`` prints (k, g, the centre c, tau)."""
    # Cached by type and sign too: 1 == 1.0 and 0.0 == -0.0, but they print differently.
    return _printed("number", type(value), math.copysign(1.0, value), value, dialect)


def _bound_text(value: float, dialect: str) -> str:
    """How a clipping bound prints (``rewriters.clipping``)."""
    return _printed("bound", type(value), math.copysign(1.0, value), value, dialect)


@functools.lru_cache(maxsize=4096)
def _printed(kind: str, cls: type, sign: float, value: float, dialect: str) -> str:
    node = exp.Literal.number(value) if kind == "number" else bound_literal(value)
    return exp.select(node).sql(dialect_named(dialect))[len("SELECT "):]


def _float_text(value: float) -> str:
    """How ``mechanisms.base.float_literal`` quotes a mechanism parameter."""
    return f"'{float(value)!r}'"


def _bounded(query: AggregateQuery) -> dict[str, tuple[float, float]]:
    """The clipping interval of every bounded argument (by its SQL), or raise if two differ."""
    found: dict[str, tuple[float, float]] = {}
    for m in query.measurements:
        key = m.argument_sql
        if key is None or m.lower is None or m.upper is None:
            continue
        if found.setdefault(key, (m.lower, m.upper)) != (m.lower, m.upper):
            raise _Unfit
    return found


def _declared(query: AggregateQuery) -> set[str]:
    """The bounded arguments (by their SQL) clipped at the declared bounds of a column a
    ranked copy stores clipped (``rewriters.clipping.stored_clip``): an answer over the copy
    reads that column instead of a clip with the bounds in it, a structure of its own (the
    bounds are then fixed: the template keeps them, no hole)."""
    return {m.argument_sql for m in query.measurements
            if m.argument_sql is not None and m.argument is not None and m.lower is not None
            and m.upper is not None and stored_clip(query.table_policy, m.argument,
                                                    query.alias, m.lower, m.upper) is not None}


class _Unfit(Exception):
    """These values cannot be expressed by this template (render in full)."""


def signature(query: AggregateQuery, plan: NoisePlan, sampled: bool) -> tuple[object, ...]:
    """The properties of the values that change the structure of the SQL (see the module doc).

    On a stored sample k and g are kept as they are (the rank filter appears only for k below
    the table's limit): few values, one template each.
    """
    k, g = query.stability, query.max_groups
    caps: tuple[object, ...] = (k, g) if sampled else (g is None, g is not None and g < k)
    declared = _declared(query)
    bounds = tuple(sorted((key, lo < 0, float(lo).is_integer(), hi < 0, float(hi).is_integer(),
                           key in declared) for key, (lo, hi) in _bounded(query).items()))
    centres = tuple((m.id, m.center == 0, math.copysign(1.0, m.center))
                    for m in query.measurements if m.lower is not None)
    mechanisms = tuple((mid, type(m).__name__) for mid, m in plan.all_mechanisms().items())
    gate = plan.threshold
    return (caps, bounds, centres, mechanisms,
            None if gate is None else (gate.measurement_id, gate.separate))


def _sources(query: AggregateQuery, plan: NoisePlan, dialect: str, sampled: bool
             ) -> dict[Source, str]:
    """The text of every varying value of (query, plan), by where it comes from."""
    out: dict[Source, str] = {}
    if not sampled:
        out[("k",)] = _number_text(query.stability, dialect)
        if query.max_groups is not None and query.max_groups < query.stability:
            out[("g",)] = _number_text(query.max_groups, dialect)
    for key, (lo, hi) in _bounded(query).items():
        out[("lo", key)] = _bound_text(lo, dialect)
        out[("hi", key)] = _bound_text(hi, dialect)
    for m in query.measurements:
        if m.lower is not None:
            out[("c", m.id)] = _number_text(m.center, dialect)
    if plan.threshold is not None:
        out[("tau",)] = _number_text(plan.threshold.threshold, dialect)
    for mid, mechanism in plan.all_mechanisms().items():
        for f in dataclasses.fields(mechanism):
            value = getattr(mechanism, f.name)
            if isinstance(value, float):
                out[("m", mid, f.name, 1)] = _float_text(value)
                out[("m", mid, f.name, -1)] = _float_text(-value)
    return out


class OneTableTemplate:
    """The SQL (database noise) of one single-table query shape, with its values as holes."""

    def __init__(self, raw: str, holes: dict[str, tuple[Source, ...]],
                 constants: dict[Source, str], dialect: str, sampled: bool) -> None:
        self._raw = raw
        self._text = TextTemplate(raw, holes)
        self._sources = frozenset(s for group in holes.values() for s in group) | frozenset(
            constants)
        self._holes = holes          # placeholder text -> the sources it stands for
        self._constants = constants  # sources whose text was the same in every rendering
        self._dialect = dialect
        self._sampled = sampled

    @classmethod
    def build(cls, query: AggregateQuery, plan: NoisePlan, render: Callable[
            [AggregateQuery, NoisePlan], str], dialect: str, sampled: bool, full: str
            ) -> OneTableTemplate | None:
        """The template of ``query``'s shape, or None when it cannot be made exact.

        ``render`` is the full rendering (rewrite and SQL text); ``full`` its text for
        (query, plan), which the template must reproduce too.
        """
        try:
            # Epsilons far apart: every derived mechanism parameter differs between the two
            # sets (the snapping grid Lambda and bound B take few values for nearby epsilons).
            a = _placeholders(query, plan, sampled, 0.01)
            b = _placeholders(query, plan, sampled, 10.0)
        except (_Unfit, ValueError):
            return None
        expected = signature(query, plan, sampled)
        if signature(*a, sampled) != expected or signature(*b, sampled) != expected:
            return None
        text_a = render(*a)
        values_a = _sources(*a, dialect, sampled)
        values_b = _sources(*b, dialect, sampled)
        holes: dict[str, list[Source]] = {}
        constants: dict[Source, str] = {}
        for source, text in values_a.items():
            if values_b.get(source) == text:
                constants[source] = text
            else:
                holes.setdefault(text, []).append(source)
        template = cls(text_a, {h: tuple(s) for h, s in holes.items()}, constants, dialect,
                       sampled)
        if template.sql(*b) != render(*b) or template.sql(query, plan) != full:
            return None
        return template

    def sql(self, query: AggregateQuery, plan: NoisePlan) -> str | None:
        """The statement for (query, plan), or None when its values do not fit the template."""
        try:
            values = _sources(query, plan, self._dialect, self._sampled)
        except _Unfit:
            return None
        if values.keys() != self._sources:  # a value the template has no place for
            return None
        texts: dict[str, str] = {}
        for hole, sources in self._holes.items():
            found = {values.get(s) for s in sources}
            if len(found) != 1 or None in found:  # sources that shared a placeholder differ
                return None
            texts[hole] = found.pop()  # type: ignore[assignment]
        for source, text in self._constants.items():
            # The same in both placeholder sets (a delta of 0, the AVG centre of a plain SUM):
            # fixed text, so the value must not differ if that text is anywhere in the SQL.
            if values[source] != text and text in self._raw:
                return None
        return self._text.fill(texts)


def _placeholders(query: AggregateQuery, plan: NoisePlan, sampled: bool, epsilon: float
                  ) -> tuple[AggregateQuery, NoisePlan]:
    """Random stand-ins for every varying value, with the signature of (query, plan) if the
    draws allow it (the caller checks).  Never run: sensitivities are left stale on purpose, and
    the plan is built from placeholder sensitivities; only the SQL text is used."""
    draw = secrets.SystemRandom()
    k, g = query.stability, query.max_groups
    if not sampled:
        k = draw.randrange(10**8, 10**9)
        if g is not None:
            g = draw.randrange(10**7, 10**8) if g < query.stability else k + draw.randrange(
                1, 10**6)
    placeholder = dataclasses.replace(query, stability=k, max_groups=g)
    real = _bounded(query)
    if real:
        # Placeholder bounds lie outside the declared interval: drop it so with_bounds accepts
        # them (it re-centres the AVG outputs exactly as for real bounds).
        placeholder = dataclasses.replace(placeholder, measurements=tuple(
            dataclasses.replace(m, lower=-math.inf, upper=math.inf) if m.lower is not None
            else m for m in placeholder.measurements))
        centres = {m.argument_sql: m.center for m in query.measurements
                   if m.lower is not None and m.argument is not None and m.center}
        declared = _declared(query)
        bounds = {key: (lo, hi) if key in declared else _bound_pair(draw, lo, hi,
                                                                     centres.get(key))
                  for key, (lo, hi) in real.items()}
        placeholder = placeholder.with_bounds(bounds)
    gate = plan.threshold
    requests = [NoiseRequest(m.id, float(draw.randrange(10**6, 10**7)) if m.integral else
                             draw.uniform(1e3, 1e4), m.integral) for m in query.measurements]
    threshold = None if gate is None else ThresholdRequest(
        None if gate.separate else gate.measurement_id, draw.randrange(10**6, 10**7))
    fake = plan_noise(requests, draw.uniform(epsilon, 2 * epsilon), draw.uniform(1e-9, 1e-7),
                      threshold)
    return placeholder, fake


def _bound_pair(draw: secrets.SystemRandom, lo: float, hi: float, centre: float | None
                ) -> tuple[float, float]:
    """Two random bounds with the signs and integrality of (lo, hi), lo < hi, and a centre of
    the sign of ``centre`` (None: the centre is not rendered)."""
    def one(value: float) -> float:
        magnitude = float(draw.randrange(10**6, 10**7))
        if not float(value).is_integer():
            magnitude += draw.randrange(1, 10**6) / 10**6
        return -magnitude if value < 0 else magnitude

    for _ in range(100):
        a, b = one(lo), one(hi)
        if a < b and (centre is None or (a + b) * centre > 0):
            return a, b
    raise _Unfit


#: Between the two texts of a proxy-noise query (its measurements' statement, its finish),
#: rendered and templated as one: drawn from os.urandom, so no analyst's text holds it.
_PROXY_SEPARATOR = f"\n-- chorus {secrets.token_hex(16)}\n"


def proxy_texts(measure: str, finish: str) -> str:
    """The measurements' statement and the finish of a proxy-noise query as one text."""
    return f"{measure}{_PROXY_SEPARATOR}{finish}"


def split_proxy_texts(text: str) -> tuple[str, str]:
    """The two texts :func:`proxy_texts` joined."""
    measure, finish = text.split(_PROXY_SEPARATOR)  # exactly once, or this raises
    return measure, finish


_NONE = object()  # cached: this shape has no exact template (render in full every time)
_SEEN = object()  # cached: this shape was rendered once; its template is built when it returns


def one_table_sql(cache: Any, key: tuple[object, ...], query: AggregateQuery, plan: NoisePlan,
                  dialect: str, sampled: bool,
                  render: Callable[[AggregateQuery, NoisePlan], str],
                  sighting: bool = True) -> str:
    """The database-noise SQL of a single-table query (or, with proxy noise, its
    :func:`proxy_texts`): from its shape's template when there is one (``cache`` keeps them
    under ``key`` plus the values' signature), else rendered in full.

    ``sighting=False``: a rendering that does not count as a sighting of the shape (the
    statement at the limit of a query whose cap and bounds are chosen next: the same query's
    final statement, moments later, is its first sighting; counted, it was the second and
    built the template inside the first run of every new query)."""
    if not query.normalized_sql:  # no shape to key a template on
        return render(query, plan)
    try:
        full_key = ("one-table", *key, signature(query, plan, sampled))
    except _Unfit:
        return render(query, plan)
    template = cache.get(full_key)
    if template is None or template is _SEEN:
        sql = render(query, plan)
        # Building a template renders the shape twice more: worth it only for a shape that
        # comes back (a new query text is often asked once), so the first sighting renders
        # once and the second builds it.
        if sighting and template is None:
            cache.put(full_key, _SEEN)
        elif sighting:
            built = OneTableTemplate.build(query, plan, render, dialect, sampled, sql)
            cache.put(full_key, _NONE if built is None else built)
        return sql
    filled = template.sql(query, plan) if template is not _NONE else None
    return render(query, plan) if filled is None else filled
