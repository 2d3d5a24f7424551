"""The read model's host: the one :class:`~runwatch.hosting.host.Host`, with the options the
projections need.

- the folds of :func:`runwatch.folds.projection_folds` (run state; accounting's running
  totals for the views), without deduplication by event id: every record is applied
  exactly once by its position, which is committed with the views;
- the terminal barrier (:mod:`runwatch.hosting.barrier`);
- the view (:class:`projections.materializer.Materializer`) and a read model
  (:class:`projections.store.ReadModel`) as the store, so views, fold states, held records
  and positions are one commit.

The live follower (:mod:`runwatch.hosting.follow`), the demo's plane and the replay
(:mod:`runwatch.hosting.replay`) all build it here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runwatch.hosting.barrier import BARRIER_TOPICS, TerminalBarrier
from runwatch.hosting.host import Host
from runwatch.hosting.stores import ReadModelState

#: Every topic the read model folds (lifecycle, the barrier topics, telemetry).
INPUTS = ("runwatch.lifecycle", *BARRIER_TOPICS, "runwatch.telemetry")


def read_model_host(
    store: Any = None,
    policy: Any = None,
    prices: Any = None,
    *,
    barrier: bool = True,
    owns: Callable[[bytes | None], bool] | None = None,
) -> Host:
    """A host folding into ``store`` (a :class:`~projections.store.ReadModel`; default: a
    fresh in-memory one), resuming from what it holds. ``policy``/``prices``: the run-state
    policy and the price list (None: packaged). ``barrier``: hold terminals (off only for
    tests that feed one topic). ``owns``: a key-sharded replay's ownership test."""
    from projections.materializer import Materializer
    from projections.store import InMemoryReadModel
    from runwatch.folds import projection_folds

    host = Host(
        projection_folds(policy, prices),
        ReadModelState(store if store is not None else InMemoryReadModel()),
        barrier=TerminalBarrier() if barrier else None,
        view=Materializer,
        owns=owns,
    )
    if set(host.folds.topics) != set(INPUTS):
        raise ValueError(f"the read model's folds read {host.folds.topics}, not {INPUTS}")
    return host
