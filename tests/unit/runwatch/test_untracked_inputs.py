"""A fold's replayable inputs are folded without deduplicating them (``replayable_inputs``).

Found by review (2026-11-28): once the run controller read every telemetry record of a run
(to page a pause nobody answers), each step's id went into the run's window of 256 recent
ids, so after ~256 steps the run's lifecycle ids were gone from it: a redelivered old
``RunPaused`` (at-least-once delivery) was folded again, the controller took a resumed run
for paused, and a later paging alert only owed a pause instead of pausing the run. Every
hosting path is checked: the hosted fold (replay), the one host (embedded, sharded) and
the per-event path (faust agents).
"""

from __future__ import annotations

import uuid
from typing import Any

from events import AlertFired, PauseRequested, RunResumed, RunStarted, RunSubmitted
from events.catalog.lifecycle import RunPaused
from events.catalog.trainer import TrainerStepCompleted
from events.codec import encode
from events.envelope import EventBase
from events.log.base import Record
from runwatch.hosting.core import HostedFold, RecentIds, Slot, apply_event, untracked_topics
from runwatch.hosting.host import Host
from runwatch.hosting.stores import NoState
from stream_processors.control import ControlPolicy, RunControllerFold

_n = iter(range(1, 1_000_000))


def ev(cls: type[EventBase], step: int | None = None, **kw: Any) -> EventBase:
    n = next(_n)
    return cls(
        event_id=uuid.UUID(int=n),
        tenant_id="acme",
        run_id="r1",
        step=step,
        ts=float(n),
        producer="hook/r1/x",
        seq=n,
        **kw,
    )


def history() -> tuple[list[EventBase], EventBase, EventBase]:
    """A run paused and resumed, 300 steps, then its old RunPaused again and a page."""
    paused = ev(RunPaused, 5, reason="person", request_id="", requested_by="", alert_id="")
    events = [
        ev(RunSubmitted, algorithm="grpo"),
        ev(RunStarted),
        paused,
        ev(RunResumed, 5, reason="go", request_id=""),
        *[ev(TrainerStepCompleted, s, kl_to_ref=0.1) for s in range(6, 306)],
    ]
    alert = ev(
        AlertFired,
        400,
        alert_id="r1:kl_blowup:400",
        detector="kl_blowup",
        layer="algorithmic",
        routing="page",
        window_start=1,
        window_end=400,
        config_version="v",
        reason="kl",
        first_response="x",
    )
    return events, paused, alert


def fold() -> RunControllerFold:
    return RunControllerFold(ControlPolicy(version="p"))


def test_the_controller_declares_its_steps_replayable() -> None:
    assert untracked_topics(fold()) == frozenset({"runwatch.telemetry"})
    assert untracked_topics(object()) == frozenset()  # type: ignore[arg-type]


def test_hosted_fold_absorbs_an_old_lifecycle_fact_after_many_steps() -> None:
    events, paused, alert = history()
    hf = HostedFold(fold())
    for e in events:
        hf.feed(e)
    assert hf.feed(paused) is None and hf.duplicates == 1
    derived = hf.feed(alert)
    assert derived is not None and [type(d) for d in derived] == [PauseRequested]


def test_a_step_that_changes_nothing_is_not_stored() -> None:
    events, _, _ = history()
    hf = HostedFold(fold())
    for e in events[:4]:
        hf.feed(e)
    hf.dirty.clear()
    for e in events[4:]:
        hf.feed(e)
    assert hf.dirty == set() and hf.duplicates == 0


def test_the_one_host_absorbs_it_too() -> None:
    events, paused, alert = history()
    host = Host([fold()], NoState())
    records = [
        Record(type(e).TOPIC, 0, i, e.key(), encode(e), 0)
        for i, e in enumerate([*events, paused, alert])
    ]
    out = host.process(records)
    assert host.duplicates == 1
    assert [type(d) for d in out] == [PauseRequested]


def test_the_per_event_path_absorbs_it_and_stores_nothing_for_a_quiet_step() -> None:
    events, paused, alert = history()
    f = fold()
    slot = Slot(f.initial(), RecentIds(), None)
    outs = [apply_event(f, slot, e) for e in events]
    assert outs[-1] is None  # a step of a live run: nothing to store
    assert apply_event(f, slot, paused) is None
    derived = apply_event(f, slot, alert)
    assert derived is not None and [type(d) for d in derived] == [PauseRequested]
