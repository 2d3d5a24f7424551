"""Score-integrity checks beyond the schema gate: degenerate outputs and canary probes.

Both are pure. :func:`apply_degenerate` is a fold over gated score batches (window counted
in batches, no clock): a batch is *constant* when its scores spread less than ``eps``
(under GRPO a constant group has zero advantage: a dead gradient, usually a bug); the
tracker flags when every batch of the last ``window`` was constant. It flags, it never
changes a score.

Canary probes are held-out (prompt, completion) pairs with a platform reference score
(e.g. known-bad answers that must stay low). They are mixed into a real batch at positions
the tenant cannot tell apart (:func:`mix_canaries`, positions drawn by the caller's RNG),
split back out after the gate (:func:`split_canaries`), and judged (:func:`judge_canaries`):
*inflated* when the probes' mean score exceeds the reference mean by more than the
tolerance. Probe scores never reach the trainer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class DegenerateState:
    window: int = 8
    eps: float = 1e-9
    recent: tuple[bool, ...] = ()  # constant? for the last ``window`` batches, oldest first


@dataclass(frozen=True, slots=True)
class DegenerateReport:
    batch_constant: bool
    constant_rate: float  # over the current window
    flagged: bool  # every batch of a full window was constant


def apply_degenerate(
    state: DegenerateState, scores: tuple[float, ...]
) -> tuple[DegenerateState, DegenerateReport]:
    """Fold one gated batch into the tracker."""
    constant = len(scores) > 0 and (max(scores) - min(scores)) <= state.eps
    recent = ((*state.recent, constant))[-state.window :]
    new = DegenerateState(state.window, state.eps, recent)
    rate = sum(recent) / len(recent)
    flagged = len(recent) == state.window and all(recent)
    return new, DegenerateReport(constant, rate, flagged)


@dataclass(frozen=True, slots=True)
class CanaryProbe:
    """A held-out probe: the platform's reference score for this (prompt, completion)."""

    probe_id: str
    prompt: str
    completion: str
    expected: float

    def as_item(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "completion": self.completion}


@dataclass(frozen=True, slots=True)
class CanarySet:
    """Probes mixed into every ``every``-th batch; inflation beyond ``tolerance`` trips."""

    probes: tuple[CanaryProbe, ...]
    every: int = 10
    tolerance: float = 0.1


@dataclass(frozen=True, slots=True)
class CanaryVerdict:
    n: int
    score_mean: float
    expected_mean: float
    inflated: bool
    scores: tuple[float, ...]


def mix_canaries(
    batch: list[dict[str, Any]], probes: tuple[CanaryProbe, ...], rng: random.Random
) -> tuple[list[dict[str, Any]], tuple[int, ...]]:
    """Insert the probes at random positions; returns the mixed batch and probe positions
    (sorted, in probe order of insertion)."""
    total = len(batch) + len(probes)
    positions = sorted(rng.sample(range(total), len(probes)))
    mixed: list[dict[str, Any]] = []
    items = iter(batch)
    probe_iter = iter(probes)
    pos_set = set(positions)
    for i in range(total):
        mixed.append(next(probe_iter).as_item() if i in pos_set else next(items))
    return mixed, tuple(positions)


def split_canaries(
    scores: tuple[float, ...], positions: tuple[int, ...]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(batch scores, probe scores) from the scores of a mixed batch."""
    pos = set(positions)
    batch = tuple(s for i, s in enumerate(scores) if i not in pos)
    probes = tuple(scores[i] for i in positions)
    return batch, probes


def judge_canaries(canaries: CanarySet, probe_scores: tuple[float, ...]) -> CanaryVerdict:
    n = len(probe_scores)
    mean = sum(probe_scores) / n if n else 0.0
    expected = sum(p.expected for p in canaries.probes) / len(canaries.probes)
    return CanaryVerdict(n, mean, expected, mean > expected + canaries.tolerance, probe_scores)
