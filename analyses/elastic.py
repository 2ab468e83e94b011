"""Elastic sensitivity and its smooth bound (Johnson, Near, Song, VLDB 2018; DESIGN.md section 5).

The elastic stability of a join relation at distance k, S(k), is built as an expression over the
max frequencies mf_k(a, t) of the join keys; this module holds that small algebra and the smooth
bound

    S* = max over integers k >= 0 of exp(-beta k) S(k),   beta = epsilon / (2 ln(2 / delta)),

for which Laplace noise of scale 2 S* / epsilon is (epsilon, delta)-DP.

Expressions (:class:`Term`) are built from constants, max-frequency leaves
``mf_k = mf + growth * k`` (growth 1 for a private table at event level, c for a table of at most
c rows per privacy unit, 0 for a public table) and the operations +, *, max and min.  All of them
are non-negative and non-decreasing in k.  An expression evaluates on a numpy vector of k at once,
renders as text with the symbolic names of its frequencies (safe to show: it names columns,
never values), and has an *upper polynomial*: a polynomial with non-negative coefficients that
bounds it for every k >= 0 (max becomes the coefficient-wise max, min any one of its arguments).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# Largest degree/beta the smooth-bound search accepts: beyond it the search could need tens of
# millions of evaluations.  Depends on the query's shape and (epsilon, delta) only, never on data.
MAX_HORIZON = 2_000_000.0


class Term:
    """A non-negative, non-decreasing function of the distance k (see the module docstring)."""

    def evaluate(self, k: np.ndarray, mf: Mapping[str, float]) -> np.ndarray:
        """Values at the distances ``k`` given the max frequencies ``mf`` (by leaf name)."""
        raise NotImplementedError

    def upper(self, mf: Mapping[str, float]) -> tuple[float, ...]:
        """Coefficients c_0, c_1, ... (all >= 0) of a polynomial >= this term for all k >= 0."""
        raise NotImplementedError

    def text(self) -> str:
        """The expression with symbolic frequencies, e.g. ``max(mf_k(o.cid), mf_k(r.cid))``."""
        raise NotImplementedError

    def leaves(self) -> tuple[Freq, ...]:
        """The max-frequency leaves, in order of appearance (with repeats removed)."""
        found: dict[str, Freq] = {}
        self._collect(found)
        return tuple(found.values())

    def _collect(self, found: dict[str, Freq]) -> None:
        for child in getattr(self, "parts", ()):
            child._collect(found)

    def at(self, k: int, mf: Mapping[str, float]) -> float:
        """The value at one distance."""
        return float(self.evaluate(np.array([float(k)]), mf)[0])


@dataclass(frozen=True)
class Const(Term):
    """A constant: a stability such as 1 (a private table), c (c rows per unit), 0 (public)."""

    value: float

    def evaluate(self, k: np.ndarray, mf: Mapping[str, float]) -> np.ndarray:
        return np.full(k.shape, self.value)

    def upper(self, mf: Mapping[str, float]) -> tuple[float, ...]:
        return (self.value,)

    def text(self) -> str:
        return f"{self.value:g}"


@dataclass(frozen=True)
class Freq(Term):
    """mf_k(column, table) = mf + growth * k: the max frequency of a join key at distance k.

    ``name`` identifies the metric (``table.column``); ``growth`` is how many rows one step of
    distance can add to one value (1 at event level, the cap c with a privacy unit, 0 for a
    public table, whose rows never change).
    """

    name: str
    growth: float

    def evaluate(self, k: np.ndarray, mf: Mapping[str, float]) -> np.ndarray:
        return mf[self.name] + self.growth * k

    def upper(self, mf: Mapping[str, float]) -> tuple[float, ...]:
        return (mf[self.name], self.growth) if self.growth else (mf[self.name],)

    def text(self) -> str:
        return f"mf_k({self.name})" if self.growth else f"mf({self.name})"

    def _collect(self, found: dict[str, Freq]) -> None:
        found.setdefault(self.name, self)


@dataclass(frozen=True)
class _Op(Term):
    parts: tuple[Term, ...]


class Add(_Op):
    """The sum of its parts."""

    def evaluate(self, k: np.ndarray, mf: Mapping[str, float]) -> np.ndarray:
        return np.sum([p.evaluate(k, mf) for p in self.parts], axis=0)

    def upper(self, mf: Mapping[str, float]) -> tuple[float, ...]:
        out: tuple[float, ...] = (0.0,)
        for p in self.parts:
            out = _poly_add(out, p.upper(mf))
        return out

    def text(self) -> str:
        return " + ".join(p.text() for p in self.parts)


class Mul(_Op):
    """The product of its parts."""

    def evaluate(self, k: np.ndarray, mf: Mapping[str, float]) -> np.ndarray:
        return np.prod([p.evaluate(k, mf) for p in self.parts], axis=0)

    def upper(self, mf: Mapping[str, float]) -> tuple[float, ...]:
        out: tuple[float, ...] = (1.0,)
        for p in self.parts:
            out = _poly_mul(out, p.upper(mf))
        return out

    def text(self) -> str:
        return " * ".join(f"({p.text()})" if isinstance(p, Add) else p.text() for p in self.parts)


class Max(_Op):
    """The largest of its parts (the elastic rule for a join of two unrelated relations)."""

    def evaluate(self, k: np.ndarray, mf: Mapping[str, float]) -> np.ndarray:
        return np.max([p.evaluate(k, mf) for p in self.parts], axis=0)

    def upper(self, mf: Mapping[str, float]) -> tuple[float, ...]:
        # Non-negative coefficients: the coefficient-wise max bounds every part for k >= 0.
        out: tuple[float, ...] = (0.0,)
        for p in self.parts:
            q = p.upper(mf)
            n = max(len(out), len(q))
            out = tuple(max(_coef(out, i), _coef(q, i)) for i in range(n))
        return out

    def text(self) -> str:
        return "max(" + ", ".join(p.text() for p in self.parts) + ")"


class Min(_Op):
    """The smallest of its parts: several AND-ed join equalities, each a valid bound."""

    def evaluate(self, k: np.ndarray, mf: Mapping[str, float]) -> np.ndarray:
        return np.min([p.evaluate(k, mf) for p in self.parts], axis=0)

    def upper(self, mf: Mapping[str, float]) -> tuple[float, ...]:
        # Any part bounds the min; take the one of lowest degree, then smallest coefficients.
        return min((p.upper(mf) for p in self.parts), key=lambda q: (len(q), q[::-1]))

    def text(self) -> str:
        return "min(" + ", ".join(p.text() for p in self.parts) + ")"


def add(*terms: Term) -> Term:
    """a + b + ..., dropping zero constants."""
    kept = [t for t in terms if not (isinstance(t, Const) and t.value == 0)]
    consts = [t for t in kept if isinstance(t, Const)]
    others = [t for t in kept if not isinstance(t, Const)]
    if len(consts) > 1:
        others.append(Const(sum(c.value for c in consts)))
    else:
        others += consts
    if not others:
        return Const(0.0)
    return others[0] if len(others) == 1 else Add(tuple(others))


def mul(*terms: Term) -> Term:
    """a * b * ..., folding constants (0 absorbs, 1 disappears)."""
    value = 1.0
    others: list[Term] = []
    for t in terms:
        if isinstance(t, Const):
            value *= t.value
        else:
            others.append(t)
    if value == 0:
        return Const(0.0)
    if value != 1 or not others:
        others.insert(0, Const(value))
    return others[0] if len(others) == 1 else Mul(tuple(others))


def maximum(*terms: Term) -> Term:
    """max(a, b, ...), dropping zero constants (every term is >= 0)."""
    kept = [t for t in terms if not (isinstance(t, Const) and t.value == 0)]
    unique = list(dict.fromkeys(kept))
    if not unique:
        return Const(0.0)
    return unique[0] if len(unique) == 1 else Max(tuple(unique))


def minimum(*terms: Term) -> Term:
    """min(a, b, ...)."""
    unique = list(dict.fromkeys(terms))
    if any(isinstance(t, Const) and t.value == 0 for t in unique):
        return Const(0.0)
    return unique[0] if len(unique) == 1 else Min(tuple(unique))


def _coef(p: Sequence[float], i: int) -> float:
    return p[i] if i < len(p) else 0.0


def _poly_add(p: Sequence[float], q: Sequence[float]) -> tuple[float, ...]:
    n = max(len(p), len(q))
    return tuple(_coef(p, i) + _coef(q, i) for i in range(n))


def _poly_mul(p: Sequence[float], q: Sequence[float]) -> tuple[float, ...]:
    out = [0.0] * (len(p) + len(q) - 1)
    for i, a in enumerate(p):
        for j, b in enumerate(q):
            out[i + j] += a * b
    return tuple(out)


# -- the smooth bound ----------------------------------------------------------------------------

def smoothing_beta(epsilon: float, delta: float) -> float:
    """beta = epsilon / (2 ln(2 / delta)) (Johnson et al., Definition 9; needs delta > 0)."""
    if not epsilon > 0:
        raise ValueError("epsilon must be positive")
    if not 0 < delta < 1:
        raise ValueError("the smooth bound needs 0 < delta < 1")
    return epsilon / (2.0 * math.log(2.0 / delta))


@dataclass(frozen=True)
class SmoothBound:
    """S* = exp(-beta k*) S(k*) at the peak k*, with beta and S(0)."""

    value: float
    peak_k: int
    beta: float
    at_zero: float

    def scale(self, epsilon: float, multiplier: float = 1.0) -> float:
        """The Laplace scale 2 S* m / epsilon for an aggregate of per-row factor m."""
        return 2.0 * self.value * multiplier / epsilon


def _tail_bound(poly: Sequence[float], beta: float, k0: float) -> float:
    """An upper bound of exp(-beta k) P(k) over all real k >= k0, for P with coefficients >= 0.

    Term by term: k^i exp(-beta k) rises until k = i / beta and falls after it, so its largest
    value on [k0, inf) is at k0 when k0 >= i / beta, and (i / beta)^i exp(-i) otherwise.
    """
    total = 0.0
    for i, c in enumerate(poly):
        if c == 0:
            continue
        top = i / beta
        if k0 >= top:
            total += c * math.exp(i * math.log(k0) - beta * k0) if i else c * math.exp(-beta * k0)
        else:
            total += c * math.exp(i * math.log(top) - i)
    return total


def smooth_bound(term: Term, mf: Mapping[str, float], beta: float) -> SmoothBound:
    """S* = max over integers k >= 0 of exp(-beta k) S(k), exactly (up to float rounding).

    When does the search stop?  DESIGN.md says exp(-beta k) S(k) has a single peak because S is a
    polynomial; that holds for products of factors (mf + k) (log-concave), but not for every
    elastic expression: 1 + a k^3 with small a, or max(P, Q) of a constant P and a quadratic Q,
    first fall and then rise again, so stopping at the first fall could return far too small an
    S*.  Instead the search scans k = 0, 1, 2, ... in blocks and stops as soon as a bound on the
    whole remaining tail, from the term's upper polynomial (:func:`_tail_bound`), is at most the
    best value found: no later k can beat it.  The number of steps follows from the data and beta,
    never from a fixed horizon; it ends because the tail bound tends to 0 as k grows.
    """
    if not beta > 0:
        raise ValueError("beta must be positive")
    poly = term.upper(mf)
    degree = max((i for i, c in enumerate(poly) if c > 0), default=0)
    if degree / beta > MAX_HORIZON:
        raise ValueError(
            f"epsilon is too small for the smooth bound of this join (degree {degree}, "
            f"beta {beta:.3g}): the search would exceed {MAX_HORIZON:g} steps")
    at_zero = term.at(0, mf)
    best, best_k = -1.0, 0
    start, block = 0, 256
    while True:
        ks = np.arange(start, start + block, dtype=float)
        values = np.exp(-beta * ks) * term.evaluate(ks, mf)
        i = int(np.argmax(values))
        if values[i] > best:
            best, best_k = float(values[i]), start + i
        start += block
        if _tail_bound(poly, beta, float(start)) <= best:
            break
        block = min(block * 2, 65536)
    return SmoothBound(best, best_k, beta, at_zero)
