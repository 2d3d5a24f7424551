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

A probe must not be told apart by its *shape* either, or a reward could score probes at
the reference and everything else high. Each probe takes the shape of a real item of the
batch it rides in — the same keys, in the same order, values of the same types
(:meth:`CanaryProbe.as_item`) — and batches laid out in groups get probes as whole groups
(``CanarySet.group``). Its *content* is the probe author's part: a probe set drawn from
the same distribution as the real items (``CanarySet.draw``; the trainer's draws task
items with wrong completions of its model's lengths) leaves nothing to tell.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
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
    """A held-out probe: the platform's reference score for this (prompt, completion).

    ``fields`` are the probe's further item fields (e.g. ``(("answer", "321"),)``) for
    batches whose items carry more than ``prompt`` and ``completion``.
    """

    probe_id: str
    prompt: str
    completion: str
    expected: float
    fields: tuple[tuple[str, Any], ...] = ()

    def as_item(self, template: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The probe as a batch item. Given ``template`` (a real item of the batch it rides
        in) it takes that item's shape: exactly its keys, in its order, each value of the
        same type — the probe's own value where it has one of that type, else the
        template's — so no key, order or type tells a probe from a real item."""
        own: dict[str, Any] = {
            "prompt": self.prompt,
            "completion": self.completion,
            **dict(self.fields),
        }
        if template is None:
            return own
        out: dict[str, Any] = {}
        for key, real in template.items():
            mine = own.get(key, _MISSING)
            out[key] = mine if type(mine) is type(real) else real
        return out


_MISSING = object()

#: Draws fresh probes for one batch (given that batch and the client's RNG).
ProbeSource = Callable[[Sequence[Mapping[str, Any]], random.Random], Sequence[CanaryProbe]]


@dataclass(frozen=True, slots=True)
class CanarySet:
    """Probes mixed into every batch, judged every ``every``-th batch over the probes of
    the ``every`` batches since the last verdict; inflation beyond ``tolerance`` trips.
    (Probes in some batches only would make those batches longer: a reward that counts
    its items would know when to be honest.)

    ``probes`` are fixed; ``draw``, when given, makes fresh ones for each batch instead
    (from the same distribution as its real items: the trainer draws task items with
    wrong completions of the lengths its model produces). ``group``: probes go in as
    contiguous runs of ``group`` at run boundaries, for batches laid out in groups (GRPO:
    ``group_size`` completions of one prompt side by side); 1 places each probe anywhere.
    """

    probes: tuple[CanaryProbe, ...] = ()
    every: int = 10
    tolerance: float = 0.1
    group: int = 1
    draw: ProbeSource | None = None

    def probes_for(
        self, batch: Sequence[Mapping[str, Any]], rng: random.Random
    ) -> tuple[CanaryProbe, ...]:
        return tuple(self.draw(batch, rng)) if self.draw is not None else self.probes


@dataclass(frozen=True, slots=True)
class CanaryVerdict:
    n: int
    score_mean: float
    expected_mean: float
    inflated: bool
    scores: tuple[float, ...]


def mix_canaries(
    batch: list[dict[str, Any]],
    probes: Sequence[CanaryProbe],
    rng: random.Random,
    group: int = 1,
) -> tuple[list[dict[str, Any]], tuple[int, ...]]:
    """Insert the probes at random positions, each shaped like a real item of ``batch``
    (:meth:`CanaryProbe.as_item`); returns the mixed batch and the probe positions (sorted,
    in probe order). With ``group`` > 1 (and both lengths multiples of it) the probes go
    in as runs of ``group`` between the batch's own runs."""
    if group < 1 or len(batch) % group or len(probes) % group:
        group = 1
    slots_b, slots_p = len(batch) // group, len(probes) // group
    chosen = set(rng.sample(range(slots_b + slots_p), slots_p))
    mixed: list[dict[str, Any]] = []
    positions: list[int] = []
    b = p = 0
    for slot in range(slots_b + slots_p):
        if slot in chosen:
            template = batch[rng.randrange(len(batch))] if batch else None
            for _ in range(group):
                positions.append(len(mixed))
                mixed.append(probes[p].as_item(template))
                p += 1
        else:
            mixed.extend(batch[b * group : (b + 1) * group])
            b += 1
    return mixed, tuple(positions)


def split_canaries(
    scores: tuple[float, ...], positions: tuple[int, ...]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(batch scores, probe scores) from the scores of a mixed batch."""
    pos = set(positions)
    batch = tuple(s for i, s in enumerate(scores) if i not in pos)
    probes = tuple(scores[i] for i in positions)
    return batch, probes


def judge_canaries(
    canaries: CanarySet,
    probe_scores: tuple[float, ...],
    probes: Sequence[CanaryProbe] | None = None,
) -> CanaryVerdict:
    """The verdict on one batch's probe scores against the reference of the probes that
    rode in it (``probes``; default: the set's fixed probes)."""
    used = canaries.probes if probes is None else probes
    n = len(probe_scores)
    mean = sum(probe_scores) / n if n else 0.0
    expected = sum(p.expected for p in used) / len(used) if used else 0.0
    return CanaryVerdict(n, mean, expected, mean > expected + canaries.tolerance, probe_scores)
