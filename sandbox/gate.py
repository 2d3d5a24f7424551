"""The schema gate: exactly ``n`` finite floats within the declared range, or nothing.

A pure function. Whatever the tenant returned arrives here as parsed JSON (any type); only a
list of exactly ``n`` ints/floats (bools are not numbers here), all finite and inside
``[lo, hi]``, passes. Everything else is refused with a message and up to three examples of
offending positions, and booked ``tenant_bad_output`` by the caller. No score is ever
clipped, rounded to range or replaced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sandbox.types import ScoreRange


@dataclass(frozen=True, slots=True)
class GateResult:
    ok: bool
    scores: tuple[float, ...] | None
    message: str = ""
    examples: tuple[str, ...] = ()


def _refuse(message: str, examples: list[str] | None = None) -> GateResult:
    return GateResult(False, None, message, tuple((examples or [])[:3]))


def check_scores(value: object, n: int, score_range: ScoreRange) -> GateResult:
    """Validate one batch's scores. See the module docstring for the contract."""
    if not isinstance(value, list):
        return _refuse(f"scores must be a list, got {type(value).__name__}")
    if len(value) != n:
        return _refuse(f"wrong shape: {len(value)} scores for a batch of {n}")
    bad_type: list[str] = []
    non_finite: list[str] = []
    out_of_range: list[str] = []
    out: list[float] = []
    for i, s in enumerate(value):
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            bad_type.append(f"[{i}]={type(s).__name__}")
            continue
        try:
            f = float(s)
        except OverflowError:  # a JSON integer beyond float range
            f = math.inf if s > 0 else -math.inf
        if not math.isfinite(f):
            non_finite.append(f"[{i}]={f!r}")
            continue
        if not (score_range.lo <= f <= score_range.hi):
            out_of_range.append(f"[{i}]={f!r}")
            continue
        out.append(f)
    if bad_type:
        return _refuse(f"{len(bad_type)} score(s) are not numbers", bad_type)
    if non_finite:
        return _refuse(f"{len(non_finite)} score(s) are NaN or infinite", non_finite)
    if out_of_range:
        return _refuse(
            f"{len(out_of_range)} score(s) outside [{score_range.lo}, {score_range.hi}]",
            out_of_range,
        )
    return GateResult(True, tuple(out))
