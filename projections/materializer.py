"""The read model's side of a host: facts and fold decisions into views, batched for commit.

A host (``runwatch/hosting``) hands a :class:`Materializer` every input fact it applies
(:meth:`admit`), every event its folds derive (:meth:`derived`), the fold states that
changed (:meth:`sync`, once per commit, not per event) and the records that failed to
decode (:meth:`dead_letter`); :meth:`take_batch` gives what changed since the last commit
as a :class:`~projections.store.Batch`, which the host commits with its positions in one
:meth:`~projections.store.ReadModel.commit`.

Which fold decisions a view shows is the read model's choice, by fold name
(:data:`SYNC`): the run-state fold's machine and ledger (``run_state``), tenant
accounting's running totals (``accounting``). A fold not named there only feeds the
views through the events it derives (:func:`~projections.views.apply_derived`).

A run id claimed by a second tenant is never merged into the first tenant's view: the
fact is not applied (not by the view, not by any fold) and counted in
:attr:`Materializer.rejected_foreign`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, Protocol

from events.dead_letter import DeadLetter
from events.envelope import EventBase
from projections.fleet import Fleet
from projections.run_state import RunStatus
from projections.store import Batch, Snapshot
from projections.views import Points, RunView, apply_derived, apply_primary


def sync_status(view: RunView, status: RunStatus) -> None:
    """Copy the run-state fold's decisions into the view."""
    m = status.machine
    view.state, view.reason, view.failure_class = m.state, m.reason, m.failure_class
    view.attribution = asdict(m.attribution) if m.attribution else None
    led = status.ledger
    view.ledger = {
        "samples": led.counts(),
        "ok_batches": led.ok_batches,
        "failed_batches": led.failed_batches,
        "examples": [x[3] for x in led.examples],
    }
    view.counters.update(  # (the view's own counters, e.g. what its caps dropped, stay)
        rejected_transitions=len(m.rejected),
        corrections=status.corrections,
        late_after_terminal=m.late_after_terminal,
    )
    view.mechanics["rejected"] = [list(r) for r in m.rejected[-20:]]


class PriceList(Protocol):
    """What a view needs of tenant accounting's price list (``stream_processors/
    accounting``: the read model shows its totals, it does not import the room)."""

    version: str


class UsageTotals(Protocol):
    """What a view shows of one run's accounting state (tenant accounting's ``RunUsage``)."""

    gpu_seconds_by_phase: tuple[tuple[str, float], ...]
    tokens_generated: int
    tokens_trained: int
    committed_steps: int

    def by_pool(self) -> tuple[tuple[str, float], ...]: ...

    def by_kind(self) -> tuple[tuple[str, float], ...]: ...

    def spend_usd(self, prices: Any) -> float: ...


def sync_usage(view: RunView, usage: UsageTotals, prices: PriceList) -> None:
    """Copy tenant accounting's running totals (and its price list's version) into the view."""
    spend = usage.spend_usd(prices)
    view.usage = {
        "gpu_seconds_by_pool": dict(usage.by_pool()),
        "gpu_seconds_by_phase": dict(usage.gpu_seconds_by_phase),
        # what is billed: device-seconds of every kind (cpu where the run had no GPU)
        "device_seconds_by_kind": dict(usage.by_kind()),
        "tokens_generated": usage.tokens_generated,
        "tokens_trained": usage.tokens_trained,
        "committed_steps": usage.committed_steps,
        "spend_usd": spend,
        "cost_per_step_usd": spend / usage.committed_steps if usage.committed_steps else None,
        "prices_version": prices.version,
    }


#: fold name -> how its state shows in a run's view: ``(view, state, fold)``.
SYNC: dict[str, Callable[[RunView, Any, Any], None]] = {
    "run_state": lambda view, state, fold: sync_status(view, state),
    "accounting": lambda view, state, fold: sync_usage(view, state, fold.prices),
}


class Materializer:
    """Views, series points and fleet aggregates of one read model (mutable; owned by its
    host's thread)."""

    def __init__(self, snapshot: Snapshot | None = None) -> None:
        self.views: dict[str, RunView] = dict(snapshot.views) if snapshot else {}
        self.fleet: Fleet = snapshot.fleet if snapshot else Fleet()
        self.applied = 0
        self.rejected_foreign = 0
        self._points: Points = {}
        self._dirty: set[str] = set()

    def admit(self, topic: str, ev: EventBase) -> RunView | None:
        """Fold an input fact into its run's view; the view (``None``: a foreign tenant's
        claim on the run id, not applied)."""
        rid = ev.run_id
        view = self.views.get(rid)
        if view is None:
            view = self.views[rid] = RunView(ev.tenant_id, rid)
        elif view.tenant_id != ev.tenant_id:
            self.rejected_foreign += 1
            return None
        self.applied += 1
        counts = self.fleet.events
        counts[topic] = counts.get(topic, 0) + 1
        apply_primary(view, self.fleet, self._points, ev)
        self._dirty.add(rid)
        return view

    def derived(self, view: RunView, events: Sequence[EventBase]) -> None:
        fleet, points = self.fleet, self._points
        for d in events:
            apply_derived(view, fleet, points, d)

    def dead_letter(self, letter: DeadLetter) -> None:
        self.fleet.dead_letters += 1

    def sync(self, fold: Any, key: str, state: Any) -> None:
        """Show a changed fold state in its run's view (folds not in :data:`SYNC`: no-op)."""
        show = SYNC.get(fold.name)
        view = self.views.get(key)
        if show is not None and view is not None:
            show(view, state, fold)

    def take_batch(self) -> Batch:
        """What changed since the last call: the dirty views, new points, the fleet."""
        batch = Batch(
            views={r: self.views[r] for r in self._dirty},
            points=self._points,
            fleet=self.fleet,
        )
        self._dirty, self._points = set(), {}
        return batch
