"""Fleet-level aggregates of a read model: commutative sums, what the Prometheus exporter reads.

Every aggregate is a sum (integer microseconds for phase times), so a live interleaving of
topics and a replay, or a key-sharded replay's shards summed, give the same fleet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

PHASES = ("rollout", "score", "sync", "optim", "idle", "other")
#: Step-phase histogram buckets (seconds), the same for every phase.
PHASE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass(slots=True)
class Fleet:
    """Fleet-level, commutative aggregates (what the Prometheus exporter reads)."""

    phase_buckets: dict[str, list[int]] = field(default_factory=dict)
    #: Integer microseconds, so the sum is exact and independent of the order runs arrive in
    #: (a live Kafka interleaving and a replay must give the same fleet aggregates).
    phase_sum_us: dict[str, int] = field(default_factory=dict)
    phase_count: dict[str, int] = field(default_factory=dict)
    reward_samples: dict[str, int] = field(default_factory=dict)
    alerts_fired: dict[str, int] = field(default_factory=dict)  # "detector|layer|routing"
    alerts_resolved: dict[str, int] = field(default_factory=dict)  # "detector"
    transitions: dict[str, int] = field(default_factory=dict)  # to_state
    dead_letters: int = 0
    events: dict[str, int] = field(default_factory=dict)  # topic

    #: Phase timings not yet bucketed (folded in vectorized by :meth:`flush`, which every
    #: read of the aggregates goes through); never persisted.
    pending: dict[str, list[float]] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        self.flush()
        return {
            name: getattr(self, name) for name in self.__dataclass_fields__ if name != "pending"
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Fleet:
        return cls(**{k: v for k, v in doc.items() if k != "pending"})

    def flush(self) -> None:
        """Bucket the pending timings: non-cumulative counts per bucket (the last slot is
        above every bound), exact integer-microsecond sums; NaN/inf timings are skipped
        (they stay in the run's series)."""
        for phase, values in self.pending.items():
            if not values:
                continue
            arr = np.asarray(values, dtype=np.float64)
            arr = arr[np.isfinite(arr)]
            values.clear()
            if not arr.size:
                continue
            counts = np.bincount(
                np.searchsorted(PHASE_BUCKETS, arr, side="left"), minlength=len(PHASE_BUCKETS) + 1
            )
            buckets = self.phase_buckets.setdefault(phase, [0] * (len(PHASE_BUCKETS) + 1))
            self.phase_buckets[phase] = [a + int(b) for a, b in zip(buckets, counts)]
            micros = int(np.rint(arr * 1e6).astype(np.int64).sum())
            self.phase_sum_us[phase] = self.phase_sum_us.get(phase, 0) + micros
            self.phase_count[phase] = self.phase_count.get(phase, 0) + int(arr.size)
