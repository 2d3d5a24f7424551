"""A run's view and state machine stay bounded however many alert episodes or state
changes the run's own facts churn.

Found by review: a tenant's run churned one ``eval_gate_missing`` episode per two events
it sent (a learned eval cadence of one step); the view kept every episode (0.7 MB a
thousand), its state machine every fire, and each commit and API read of them (JSON on
the one event loop) slowed every other tenant's (20,000 episodes: 732 ms a commit, another
tenant's GET 1 s).
"""

from __future__ import annotations

from events import RunStateChanged
from projections.fleet import Fleet
from projections.run_state import MAX_FIRED_KEPT, RunStateFold
from projections.views import (
    MAX_ALERTS_KEPT,
    MAX_TRANSITIONS_KEPT,
    RunView,
    apply_derived,
    apply_primary,
)
from tests.projection_runs import RunFactory


def test_the_view_keeps_open_alerts_and_the_latest_resolved_and_transitions() -> None:
    f = RunFactory()
    view, fleet = RunView(f.tenant_id, f.run_id), Fleet()
    still_open = f.fired("kl_blowup", 1, alert_id="open-1")
    apply_primary(view, fleet, {}, still_open)
    for i in range(2_000):
        aid = f"churn-{i}"
        apply_primary(view, fleet, {}, f.fired("eval_gate_missing", 2 + i, alert_id=aid))
        apply_primary(view, fleet, {}, f.resolved("eval_gate_missing", 2 + i, aid))
    assert len(view.alerts) == MAX_ALERTS_KEPT
    assert "open-1" in view.alerts and "churn-1999" in view.alerts  # open; the latest
    assert view.counters["alerts_dropped"] == 2_000 + 1 - MAX_ALERTS_KEPT
    for i in range(1_000):
        change = f.ev(RunStateChanged, i, from_state="RUNNING", to_state="PAUSED_BY_GATE",
                      reason="flap")  # fmt: skip
        apply_derived(view, fleet, {}, change)
    assert len(view.transitions) == MAX_TRANSITIONS_KEPT
    assert view.counters["transitions_dropped"] == 1_000 - MAX_TRANSITIONS_KEPT
    assert fleet.transitions["PAUSED_BY_GATE"] == 1_000  # the fleet still counts them all


def test_the_state_machine_keeps_every_detector_that_fired_named() -> None:
    f = RunFactory()
    fold = RunStateFold()
    state = fold.initial()
    for ev in [*f.start(), f.fired("reward_hacking", 1, alert_id="rh")]:
        state, _ = fold.apply(state, ev)
    for i in range(1_000):
        aid = f"churn-{i}"
        for ev in (f.fired("eval_gate_missing", 2 + i, alert_id=aid),
                   f.resolved("eval_gate_missing", 2 + i, aid)):  # fmt: skip
            state, _ = fold.apply(state, ev)
    fired = state.machine.fired
    assert len(fired) == MAX_FIRED_KEPT
    assert {d for d, *_ in fired} == {"reward_hacking", "eval_gate_missing"}


def test_what_the_caps_dropped_stays_counted_and_older_states_shrink_at_once() -> None:
    """Review of the caps: the read model's sync of the run state replaced the view's
    counters (what the caps dropped was never seen), and a view or machine stored before
    the caps shrank by one entry per new one."""
    from projections.materializer import sync_status
    from projections.run_state import _with_fired

    f = RunFactory()
    view, fleet = RunView(f.tenant_id, f.run_id), Fleet()
    for i in range(MAX_ALERTS_KEPT + 10):
        aid = f"churn-{i}"
        apply_primary(view, fleet, {}, f.fired("eval_gate_missing", i, alert_id=aid))
        apply_primary(view, fleet, {}, f.resolved("eval_gate_missing", i, aid))
    fold = RunStateFold()
    status, _ = fold.apply(fold.initial(), f.start()[0])
    sync_status(view, status)
    assert view.counters["alerts_dropped"] == 10 and "rejected_transitions" in view.counters

    view.transitions = [{"to_state": "RUNNING"}] * 5_000  # as stored before the cap
    change = f.ev(RunStateChanged, 1, from_state="RUNNING", to_state="DEGRADED", reason="x")
    apply_derived(view, fleet, {}, change)
    assert len(view.transitions) == MAX_TRANSITIONS_KEPT
    assert view.transitions[-1]["to_state"] == "DEGRADED"
    old = tuple(("eval_gate_missing", "r", i, i) for i in range(5_000))
    old = (("reward_hacking", "r", 0, 0), *old)
    fired = _with_fired(old, ("kl_blowup", "r", 1, 1))
    assert len(fired) == MAX_FIRED_KEPT and fired[-1][0] == "kl_blowup"
    assert {d for d, *_ in fired} == {"reward_hacking", "eval_gate_missing", "kl_blowup"}
