"""The per-cause ledger: one counter per column, every attempt booked to exactly one.

The in-process :class:`Ledger` is a convenience for the client and the CLI. The customer-
visible counters come from the log: :func:`ledger_from_events` folds reward events
(``RewardBatchScored`` -> ``ok``, ``RewardBatchFailed`` -> its ``cause``) into the same
columns, so both views agree by construction.

Columns: ``ok``; the tenant's ``tenant_timeout``, ``tenant_crash``, ``tenant_bad_output``,
``tenant_resource_exceeded`` and ``tenant_bad_artifact`` (the file is not a reward artifact:
refused before any of it ran); the sandbox's ``platform_error``; and ``bad_input``, a batch
the *caller* handed over that cannot cross the JSON boundary (refused before it was sent:
booked to the caller, neither the tenant's fault nor dropped silently).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sandbox.types import Cause

COLUMNS: tuple[str, ...] = tuple(c.value for c in Cause)


@dataclass
class Ledger:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COLUMNS, 0))

    def book(self, cause: Cause) -> None:
        self.counts[cause.value] += 1

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)

    def tenant_failures(self) -> int:
        """Attempts booked to the tenant's code (every ``tenant_*`` column)."""
        return sum(v for k, v in self.counts.items() if k.startswith("tenant_"))


def ledger_from_events(events: Iterable[object]) -> dict[str, int]:
    """Fold reward events into ledger columns (pure; ignores other event types)."""
    counts = dict.fromkeys(COLUMNS, 0)
    for ev in events:
        kind = getattr(ev, "type", None)
        if kind == "RewardBatchScored":
            counts["ok"] += 1
        elif kind == "RewardBatchFailed":
            cause = str(ev.cause)
            counts[cause] = counts.get(cause, 0) + 1  # a newer producer's cause: kept
    return counts
