"""Cryptographic randomness for the proxy-side mode.

Every draw comes from ``os.urandom`` (the kernel CSPRNG). numpy's generators are never used: they
are seedable and predictable, and an analyst who can predict the noise can subtract it.

Two uniform samplers exist because they serve different mechanisms:

- :func:`secure_uniform` is the plain 53-bit grid ``{1, 2, ..., 2**53} / 2**53``, the same kind of
  value the databases' ``random()`` gives (Postgres: a 52-bit grid). It is what the interface asks
  for.
- :func:`secure_uniform_dense` is Mironov's ``U*``: a real uniform on (0, 1) rounded down to the
  nearest double, so small values keep their full 53-bit relative precision. Taking ``ln`` of it
  gives an exponential variate whose tail is faithful down to about 2**-1074, which the snapping
  mechanism's proof assumes (Mironov, CCS 2012, Section 5.2) and which keeps the geometric draws of
  the discrete Laplace mechanism within a relative error of about 2**-52 of their exact
  probabilities.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["secure_bits", "secure_signs", "secure_uniform", "secure_uniform_dense"]

_TWO_POW_MINUS_52 = 2.0**-52
_TWO_POW_MINUS_53 = 2.0**-53


def _check_count(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise ValueError(f"the number of draws must be an integer, got {n!r}")
    if n < 0:
        raise ValueError(f"the number of draws must be >= 0, got {n}")
    return int(n)


def secure_bits(n: int) -> np.ndarray:
    """Return ``n`` independent uniform 64-bit words (``uint64``) from ``os.urandom``."""
    n = _check_count(n)
    return np.frombuffer(os.urandom(8 * n), dtype=np.uint64).copy()


def secure_signs(n: int) -> np.ndarray:
    """Return ``n`` independent uniform signs, -1.0 or +1.0 (``float64``)."""
    n = _check_count(n)
    bits = np.frombuffer(os.urandom(n), dtype=np.uint8) & 1
    return np.where(bits == 1, -1.0, 1.0)


def secure_uniform(n: int) -> np.ndarray:
    """Return ``n`` floats uniform on ``(0, 1]`` with 53 random bits each.

    The values are ``k / 2**53`` with ``k`` uniform on ``{1, ..., 2**53}``: never 0, so ``log`` of
    them is always finite, and exactly representable, so no rounding biases the grid.
    """
    words = secure_bits(n)
    # The top 53 bits of a uniform 64-bit word are uniform on [0, 2**53); +1 moves the grid off 0.
    k = (words >> np.uint64(11)).astype(np.float64) + 1.0
    return k * _TWO_POW_MINUS_53


def _leading_zeros(words: np.ndarray) -> np.ndarray:
    """Count the leading zero bits of each nonzero ``uint64`` word, exactly.

    Each 32-bit half converts to float64 exactly, so ``frexp`` gives its bit length exactly;
    converting the whole 64-bit word could round ``2**k - 1`` up to ``2**k``.
    """
    hi = (words >> np.uint64(32)).astype(np.float64)
    lo = (words & np.uint64(0xFFFFFFFF)).astype(np.float64)
    _, hi_len = np.frexp(hi)  # bit length; 0 for 0
    _, lo_len = np.frexp(lo)
    return np.where(hi > 0, 32 - hi_len, 64 - lo_len).astype(np.int64)


def secure_uniform_dense(n: int) -> np.ndarray:
    """Return ``n`` floats distributed as a real uniform on (0, 1) rounded down to a double.

    This is the ``U*`` of Mironov (CCS 2012, Section 5.2): the binade ``[2**-(k+1), 2**-k)`` is
    chosen with probability ``2**-(k+1)`` (the number of leading zeros of a stream of fair bits),
    then the 52 mantissa bits are uniform. Unlike :func:`secure_uniform`, values near 0 are as
    finely spaced as doubles allow, so ``P(U <= y) = y (1 + O(2**-52))`` for every double ``y`` down
    to ~2**-1022.
    """
    n = _check_count(n)
    zeros = np.zeros(n, dtype=np.int64)
    pending = np.arange(n)
    # A fair-bit stream's leading zeros: read 64 bits at a time; an all-zero word (probability
    # 2**-64) only means "keep reading", so those entries loop. The loop ends after one pass in
    # practice.
    while pending.size:
        words = secure_bits(pending.size)
        nonzero = words != 0
        zeros[pending[nonzero]] += _leading_zeros(words[nonzero])
        zeros[pending[~nonzero]] += 64
        pending = pending[~nonzero]
    mantissa = (secure_bits(n) >> np.uint64(12)).astype(np.float64)  # 52 uniform bits, exact
    values = np.ldexp(1.0 + mantissa * _TWO_POW_MINUS_52, -(zeros + 1))
    # Beyond 1074 leading zeros (probability 2**-1074) the double underflows to 0; keep log finite.
    return np.maximum(values, np.nextafter(0.0, 1.0))
