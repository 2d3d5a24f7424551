"""Student's t distribution for integer degrees of freedom: upper tail and its inverse.

A test statistic whose noise scale is itself estimated from few points (an eval series'
noise from a dozen second differences, a reward slope's standard error from twenty steps)
is t-distributed, not Gaussian: with 4 degrees of freedom the one-sided 1 % point is 3.75,
not 2.33. Detectors that derive a threshold from a false-alarm budget use these.

Exact closed forms (Abramowitz & Stegun 26.7.3 / 26.7.4) for integer ``nu``: with
``theta = atan(t / sqrt(nu))``, ``P(|T| <= t)`` is a finite series in ``sin``/``cos`` of
``theta``. A non-integer ``nu`` is rounded *down* (a heavier tail: the conservative side).
Pure functions; the inverse is cached, since detectors ask for few distinct
(level, dof) pairs.
"""

from __future__ import annotations

import math
from functools import lru_cache


def t_sf(t: float, nu: float) -> float:
    """``P(T > t)`` for Student's t with ``floor(nu)`` (at least 1) degrees of freedom."""
    n = max(1, int(nu))
    if t == 0.0:
        return 0.5
    theta = math.atan(abs(t) / math.sqrt(n))
    s, c = math.sin(theta), math.cos(theta)
    c2 = c * c
    if n % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term, acc = 1.0, 1.0 if n > 1 else 0.0
        for k in range(1, (n - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            acc += term
        central = 2.0 / math.pi * (theta + s * c * acc)
    else:  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        term, acc = 1.0, 1.0
        for k in range(1, n // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            acc += term
        central = s * acc
    upper = max(0.0, 1.0 - central) / 2.0
    return upper if t > 0 else 1.0 - upper


@lru_cache(maxsize=1024)
def t_isf(alpha: float, nu: float) -> float:
    """The ``t`` with ``P(T > t) = alpha`` (``0 < alpha < 0.5``), ``floor(nu)`` dof."""
    if not 0.0 < alpha < 0.5:
        raise ValueError("t_isf needs 0 < alpha < 0.5")
    lo, hi = 0.0, 1.0
    while t_sf(hi, nu) > alpha:
        hi *= 2.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_sf(mid, nu) > alpha else (lo, mid)
    return hi
