"""The run controller as a pure fold: which alerts pause, once, and never a finished run."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from events import (
    AlertFired,
    AlertResolved,
    PauseRequested,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunResumed,
    RunStarted,
    RunSubmitted,
    UnpauseRequested,
)
from events.envelope import EventBase
from stream_processors.control import ControlPolicy, RunControllerFold
from stream_processors.control.fold import ControlState

_N = iter(range(1, 1_000_000))


def ev(cls: type[EventBase], *, tenant: str = "acme", step: int = 5, **kw: Any) -> EventBase:
    n = next(_N)
    return cls(
        event_id=uuid.UUID(int=n),
        tenant_id=tenant,
        run_id="run-1",
        step=step,
        ts=float(n),
        producer="test",
        seq=n,
        **kw,
    )


def alert(routing: str = "page", detector: str = "kl_blowup", alert_id: str = "a1", **kw: Any):
    return ev(
        AlertFired,
        alert_id=alert_id,
        detector=detector,
        layer="algorithmic",
        routing=routing,
        window_start=1,
        window_end=5,
        config_version="v",
        reason="kl slope 3x cap",
        first_response="lower the LR",
        **kw,
    )


def fold(f: RunControllerFold, events: list[EventBase]) -> tuple[ControlState, list[EventBase]]:
    """Fold ``events``; a ``RunPaused`` without a request id answers the oldest pause
    request not answered yet, as the trainer does (none: the reward's own pause)."""
    state, out = f.initial(), []
    waiting: list[str] = []
    for e in events:
        if isinstance(e, PauseRequested):
            waiting.append(str(e.event_id))
        if isinstance(e, RunPaused) and not e.request_id and waiting:
            e = e.model_copy(update={"request_id": waiting.pop(0)})
            waiting.clear()  # the trainer ignores a pause of a paused run
        state, derived = f.apply(state, e)
        out.extend(derived)
        waiting.extend(str(d.event_id) for d in derived if isinstance(d, PauseRequested))
    return state, out


def test_a_paging_alert_requests_a_pause_naming_the_alert_and_policy() -> None:
    f = RunControllerFold(ControlPolicy(version="p1"))
    a = alert()
    state, out = fold(f, [ev(RunSubmitted, algorithm="grpo"), a])
    assert len(out) == 1 and isinstance(out[0], PauseRequested)
    req = out[0]
    assert (req.actor, req.alert_id, req.policy_version) == ("controller", "a1", "p1")
    assert (req.run_id, req.tenant_id, req.step, req.ts) == (a.run_id, a.tenant_id, 5, a.ts)
    assert "kl_blowup" in req.reason and state.phase == "pausing"
    # deterministic: a replay derives the same request id
    _, again = fold(RunControllerFold(ControlPolicy(version="p1")), [a])
    assert again[0].event_id == req.event_id


@pytest.mark.parametrize("routing", ["ticket", "advisory"])
def test_ticket_and_advisory_alerts_never_pause(routing: str) -> None:
    _, out = fold(RunControllerFold(ControlPolicy()), [alert(routing=routing)])
    assert out == []


def test_one_request_while_pausing_or_paused_and_none_after_the_end() -> None:
    f = RunControllerFold(ControlPolicy())
    _, out = fold(f, [alert(alert_id="a1"), alert(alert_id="a2"), ev(RunPaused)])
    assert len(out) == 1
    _, out = fold(f, [ev(RunCompleted), alert(alert_id="a3")])
    assert out == []


def test_a_failed_run_trained_again_is_gated_again() -> None:
    """Found by review: a failed run restarted (``runwatch resume``, a requeued hooked job)
    trained with every gate off: the controller held it over, and a page asked for no
    pause (186 steps billed after the page in the review's run). Its restart's
    ``RunResumed`` (or ``RunStarted``, or ``RunPaused``: restarted still paused) makes it
    live again; a cancelled run stays over. So does a completed run its process trains
    again (a framework's second ``train()``, whose steps start again at 0: found by
    review, every page of that stage was dropped), on a fact stamped after its end."""
    f = RunControllerFold(ControlPolicy())
    failed = [ev(RunSubmitted, algorithm="grpo"), alert(alert_id="a0"), ev(RunPaused),
              ev(RunFailed, reason="CUDA error")]  # fmt: skip
    _, out = fold(f, [*failed, alert(alert_id="a1")])
    assert len(out) == 1  # a0's pause only: a failed run no process trains is not paused
    for restart in (RunResumed, RunStarted):
        state, out = fold(f, [*failed, ev(restart), alert(alert_id="a1")])
        assert [o.alert_id for o in out] == ["a0", "a1"] and state.phase == "pausing"
    state, out = fold(f, [*failed, ev(RunPaused), ev(RunResumed), alert(alert_id="a1")])
    assert [o.alert_id for o in out] == ["a0", "a1"]
    assert f.load_state(f.dump_state(fold(f, failed)[0])).phase == "failed"
    for end, asked in ((RunCompleted, ["a1"]), (RunCancelled, [])):
        _, out = fold(f, [ev(RunSubmitted, algorithm="grpo"), ev(end, step=100),
                          ev(RunResumed, step=0), alert(alert_id="a1", step=20)])  # fmt: skip
        assert [o.alert_id for o in out] == asked, end
    stale = ev(RunResumed, step=3)  # stamped before the end: a late fact of the ended run
    _, out = fold(f, [ev(RunSubmitted, algorithm="grpo"), ev(RunCompleted, step=100), stale,
                      alert(alert_id="a1", step=20)])  # fmt: skip
    assert out == []


def test_a_page_of_the_restart_read_ahead_of_it_is_owed_and_older_states_reopen() -> None:
    """Found by review: a page of the restarted process read before its ``RunResumed``
    (another topic) was dropped in the failed phase; and a state stored before the failed
    phase existed said ``over``, so a restart never reopened it. Found by a later review:
    a page from before the failure read after it (the embedded host folds alerts a pass
    after the facts they came from) was dropped too, and the restart trained on: owed as
    well, the one pause naming both."""
    f = RunControllerFold(ControlPolicy())
    failed = [ev(RunSubmitted, algorithm="grpo"), ev(RunFailed, step=20, reason="node lost")]
    for restart in (RunResumed, RunStarted):
        state, out = fold(f, [*failed, alert(alert_id="late", step=18),  # before the failure
                              alert(alert_id="a1", step=25), ev(restart, step=20)])  # fmt: skip
        assert [type(o) for o in out] == [PauseRequested] and state.phase == "pausing"
        assert out[0].alert_id == "late" and {p.alert_id for p in state.pending} == {"late", "a1"}
    old = b'["grpo", "over", []]'  # a failed run's state stored before 2026-11-28
    state = f.load_state(old)
    assert state.phase == "failed"
    state, out = f.apply(state, ev(RunResumed, step=20))
    state, out = f.apply(state, alert(alert_id="a2", step=22))
    assert [o.alert_id for o in out] == ["a2"]


def test_a_page_from_a_step_after_the_pause_read_before_the_resume_is_owed() -> None:
    """Found by review: on Kafka the controller reads the alerts topic and the lifecycle
    in no common order. A page fired by a step trained after a person resumed the gate's
    pause, read before the trainer's ``RunResumed``, was taken as "under the gate's own
    pause: the resume covers it", and the run trained on past it. An alert from a step
    after the one the run paused at cannot be under that pause: it is owed."""
    f = RunControllerFold(ControlPolicy())
    state, out = fold(f, [ev(RunSubmitted, algorithm="grpo"), alert(alert_id="a1", step=12)])
    state, _ = f.apply(state, ev(RunPaused, step=13, request_id=str(out[0].event_id)))
    resumed, later = ev(RunResumed, step=13), alert(alert_id="a2", detector="nan_metric", step=15)
    for order in ([resumed, later], [later, resumed]):  # log order, and the alerts read first
        s, derived = state, []
        for e in order:
            s, d = f.apply(s, e)
            derived.extend(d)
        assert [d.alert_id for d in derived] == ["a2"] and s.phase == "pausing", order
    # an alert from the paused step itself is under the gate's pause, as before
    s, d = f.apply(state, alert(alert_id="a3", detector="nan_metric", step=13))
    assert (d, s.owed) == ((), ())
    assert f.load_state(f.dump_state(state)) == state and state.paused_step == 13


def test_resumed_run_is_not_paused_again_by_the_same_episode_but_is_by_a_new_one() -> None:
    f = RunControllerFold(ControlPolicy())
    events = [alert(alert_id="a1"), ev(RunPaused), ev(RunResumed), alert(alert_id="a1")]
    _, out = fold(f, events)
    assert len(out) == 1
    _, out = fold(f, [*events, alert(alert_id="a2")])
    assert [o.alert_id for o in out] == ["a1", "a2"]


def test_a_person_pausing_first_means_the_controller_does_not_ask_again() -> None:
    f = RunControllerFold(ControlPolicy())
    person = ev(PauseRequested, actor="operator", principal="ops@x", reason="maintenance")
    _, out = fold(f, [person, alert()])
    assert out == []
    # an unpause before the trainer paused makes the run live again
    _, out = fold(f, [person, ev(UnpauseRequested, actor="customer"), alert()])
    assert len(out) == 1


def test_layers_tenant_over_algorithm_over_default() -> None:
    policy = ControlPolicy.model_validate(
        {
            "version": "p",
            "algorithms": {"ppo": {"advisory_detectors": ["kl_blowup"]}},
            "tenants": {"globex": {"pause_on": ["page", "ticket"]}, "initech": {"pause_on": []}},
        }
    )
    assert policy.pauses(tenant="acme", algorithm="grpo", detector="kl_blowup", routing="page")
    assert not policy.pauses(tenant="acme", algorithm="ppo", detector="kl_blowup", routing="page")
    assert policy.pauses(tenant="globex", algorithm="grpo", detector="x", routing="ticket")
    assert not policy.pauses(tenant="initech", algorithm="grpo", detector="x", routing="page")
    f = RunControllerFold(policy)
    _, out = fold(f, [ev(RunSubmitted, algorithm="ppo"), alert(detector="kl_blowup")])
    assert out == []  # demoted to advisory for control: still fires, never pauses


def test_state_round_trips() -> None:
    f = RunControllerFold(ControlPolicy())
    state, _ = fold(f, [ev(RunSubmitted, algorithm="ppo"), alert()])
    assert f.load_state(f.dump_state(state)) == state


def test_policy_file_versioned_by_content_and_bad_keys_refused(tmp_path: Path) -> None:
    good = tmp_path / "p.yaml"
    good.write_text("version: v7\npause_on: [page]\n")
    assert ControlPolicy.load(good).version.startswith("v7+")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v7\npause_when: [page]\n")
    with pytest.raises(ValueError, match="pause_when"):
        ControlPolicy.load(bad)
    assert ControlPolicy.load().pause_on == ("page",)


def _resolved(alert_id: str) -> EventBase:
    return ev(
        AlertResolved, alert_id=alert_id, detector="kl_blowup", reason="ok", config_version="v"
    )


def test_an_alert_under_a_persons_pause_pauses_the_run_once_it_is_live_again() -> None:
    """Found by review: it was dropped, and a maintenance pause and resume let the run
    train on past a page (the detector never re-fires an open episode)."""
    f = RunControllerFold(ControlPolicy(version="p1"))
    person = ev(PauseRequested, actor="operator", principal="ops@x", reason="maintenance")
    resumed = ev(RunResumed)
    events = [person, alert(alert_id="b1"), ev(RunPaused), resumed]
    state, out = fold(f, events)
    assert len(out) == 1 and isinstance(out[0], PauseRequested)
    req = out[0]
    assert (req.actor, req.alert_id, req.step, req.ts) == ("controller", "b1", 5, resumed.ts)
    assert "while a person had the run paused" in req.reason and "kl_blowup" in req.reason
    assert state.phase == "pausing" and "b1" in state.acted and state.owed == ()
    # once: the same episode again, or a replay, asks nothing more / the same request
    _, again = fold(f, [*events, ev(RunPaused), ev(RunResumed), alert(alert_id="b1")])
    assert [o.event_id for o in again] == [req.event_id]
    # an unpause before the trainer paused makes it live too: the owed pause is asked then
    _, out = fold(f, [person, alert(alert_id="b1"), ev(UnpauseRequested, actor="operator")])
    assert [o.alert_id for o in out] == ["b1"]


def test_an_alert_under_the_gates_own_pause_is_covered_by_the_resume() -> None:
    f = RunControllerFold(ControlPolicy())
    events = [alert(alert_id="a1"), alert(alert_id="a2"), ev(RunPaused), alert(alert_id="a3")]
    _, out = fold(f, [*events, ev(RunResumed)])
    assert [o.alert_id for o in out] == ["a1"]


def test_an_owed_alert_that_resolved_is_not_owed() -> None:
    f = RunControllerFold(ControlPolicy())
    person = ev(PauseRequested, actor="customer", principal="acme", reason="look")
    _, out = fold(f, [person, alert(alert_id="b1"), ev(RunPaused), _resolved("b1"), ev(RunResumed)])
    assert out == []


def test_an_alert_under_the_rewards_own_pause_is_owed() -> None:
    """The reward's failure policy pauses the run itself (RunPaused, nobody's request)."""
    f = RunControllerFold(ControlPolicy())
    _, out = fold(f, [ev(RunPaused), alert(alert_id="b1"), ev(RunResumed)])
    assert [o.alert_id for o in out] == ["b1"]


def test_owed_alerts_round_trip_and_an_older_state_loads() -> None:
    f = RunControllerFold(ControlPolicy())
    person = ev(PauseRequested, actor="operator", principal="ops@x", reason="maintenance")
    state, _ = fold(f, [person, alert(alert_id="b1")])
    assert state.owed and f.load_state(f.dump_state(state)) == state
    old = f.load_state(b'["grpo", "paused", ["a1"]]')  # stored before owed alerts
    assert (old.phase, old.paused_by, old.owed, old.acted) == ("paused", "controller", (), ("a1",))


def test_a_pause_of_ours_after_a_persons_is_ignored_by_the_trainer_so_its_alert_is_owed() -> None:
    """Found by review: the controller asked (a1) while a person's pause was already ahead
    of it; the trainer answered the person's and ignored ours, and the fold, taking the
    pause for the gate's, dropped both a1 and b1 (an alert under the maintenance pause)."""
    f = RunControllerFold(ControlPolicy())
    state, out = fold(f, [alert(alert_id="a1")])
    person = ev(PauseRequested, actor="operator", principal="ops@x", reason="maintenance")
    answered = ev(RunPaused, request_id=str(person.event_id))
    for e in (person, answered, alert(alert_id="b1"), ev(RunResumed)):
        state, derived = f.apply(state, e)
        out.extend(derived)
    assert [o.alert_id for o in out] == ["a1", "a1"]  # the first ask, then the owed one
    assert "kl_blowup" in out[1].reason and state.phase == "pausing"
    assert {o.alert_id for o in state.pending} == {"a1", "b1"}  # both in the new request


def test_an_alert_under_a_gates_pause_after_a_person_unpaused_in_flight_is_covered() -> None:
    """Found by review: a person paused (P), a1 fired (owed), the person unpaused before the
    trainer paused, the controller asked (C); the trainer answered P, then U, then C. The
    fold took C's pause for a person's and owed b1, fired under the gate's own pause."""
    f = RunControllerFold(ControlPolicy())
    person = ev(PauseRequested, actor="operator", principal="ops@x", reason="maintenance")
    unpause = ev(UnpauseRequested, actor="operator")
    state, out = fold(f, [person, alert(alert_id="a1"), unpause])
    assert [o.alert_id for o in out] == ["a1"]
    ours = out[0]
    for e in (
        ev(RunPaused, request_id=str(person.event_id)),
        ev(RunResumed, request_id=str(unpause.event_id)),
        ev(RunPaused, request_id=str(ours.event_id)),
        alert(alert_id="b1"),
    ):
        state, derived = f.apply(state, e)
        out.extend(derived)
    assert state.paused_by == "controller" and state.owed == ()
    state, derived = f.apply(state, ev(RunResumed))
    assert derived == ()  # b1 fired under the gate's pause: the resume covered it


def test_alerts_while_our_request_is_unanswered_follow_it() -> None:
    """Second review: b1, fired while the controller's request waited behind a person's
    pause, was dropped; and a1, resolved meanwhile, was still owed."""
    f = RunControllerFold(ControlPolicy())
    state, out = fold(f, [alert(alert_id="a1")])
    person = ev(PauseRequested, actor="operator", principal="ops@x", reason="maintenance")
    for e in (person, alert(alert_id="b1"), _resolved("a1")):
        state, derived = f.apply(state, e)
        out.extend(derived)
    assert [o.alert_id for o in state.pending] == ["b1"]
    for e in (ev(RunPaused, request_id=str(person.event_id)), ev(RunResumed)):
        state, derived = f.apply(state, e)
        out.extend(derived)
    assert [o.alert_id for o in out] == ["a1", "b1"]  # b1 owed and asked for; a1 ended


def test_a_page_resolved_while_the_run_is_failed_is_not_owed_to_its_restart() -> None:
    f = RunControllerFold(ControlPolicy())
    failed = [ev(RunSubmitted, algorithm="grpo"), ev(RunFailed, step=20, reason="node lost")]
    resolved = ev(
        AlertResolved, alert_id="late", detector="kl_blowup", reason="ok", config_version="c"
    )
    state, out = fold(f, [*failed, alert(alert_id="late", step=18), resolved, ev(RunStarted)])
    assert out == [] and state.phase == "live"


def test_a_completed_run_trained_again_owes_a_page_read_ahead_of_its_reopening() -> None:
    """Review: a page of the second stage read ahead of the fact that reopens the run
    (alerts before lifecycle on Kafka) was dropped, the read model showing it while no
    pause was asked. It is owed, and asked for when the run is live again, in either
    order; a gate's pause in flight at the end stays the gate's when the run reopens."""
    f = RunControllerFold(ControlPolicy())
    start = [ev(RunSubmitted, algorithm="grpo"), ev(RunCompleted, step=100)]
    again, page = ev(RunResumed, step=0), alert(alert_id="s2", step=20)
    for order in ([again, page], [page, again]):
        _, out = fold(f, [*start, *order])
        assert [o.alert_id for o in out] == ["s2"], order
    early = [ev(RunSubmitted, algorithm="grpo"), ev(RunCompleted, step=100)]
    page = alert(alert_id="s3", step=5)  # (stamped after the end, as is what follows)
    _, out = fold(f, [*early, page, ev(RunStarted, step=None)])
    assert [o.alert_id for o in out] == ["s3"]
    state, out = fold(f, [ev(RunSubmitted, algorithm="grpo"), alert(alert_id="g"),
                          ev(RunCompleted, step=100), ev(RunStarted)])  # fmt: skip
    assert state.phase == "pausing" and state.paused_by == "controller"
