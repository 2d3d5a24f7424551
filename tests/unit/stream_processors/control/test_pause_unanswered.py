"""The run controller pages a pause nobody answers (review F1): pure-fold tests.

Found by review: a run whose loop never acts on its commands (the documented plain-hook
loop without ``hook.obey()``, ``follow_commands=False``, a reader that cannot read) trained
and billed 52 steps past a gate's pause and nothing noticed. The controller reads the
run's step facts and, more than ``pause_unanswered_steps`` past the request, derives one
``pause_unanswered`` page per request; the run's answer or end resolves it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

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
from events.catalog.trainer import StepPhaseTimed, TrainerStepCompleted
from events.catalog.usage import UsageRecorded
from events.codec import encode
from events.envelope import EventBase
from stream_processors.control import ControlPolicy, RunControllerFold
from stream_processors.control.fold import UNANSWERED, ControlState

_N = iter(range(1, 1_000_000))
S = 7  # the step the gate's alert fired at


def ev(cls: type[EventBase], *, step: int | None = S, tenant: str = "acme", **kw: Any) -> EventBase:
    n = next(_N)
    return cls(
        event_id=uuid.UUID(int=n),
        tenant_id=tenant,
        run_id="run-1",
        step=step,
        ts=kw.pop("ts", float(n)),
        producer="test",
        seq=n,
        **kw,
    )


def page(alert_id: str = "run-1:kl_blowup:7", step: int = S) -> EventBase:
    return ev(
        AlertFired,
        step=step,
        alert_id=alert_id,
        detector="kl_blowup",
        layer="algorithmic",
        routing="page",
        window_start=1,
        window_end=step,
        config_version="v",
        reason="kl 0.8 over the 0.5 ceiling",
        first_response="lower the LR",
    )


def trained(step: int, *, timed: bool = True) -> list[EventBase]:
    """What a hooked loop publishes for one step: the row, its timing and its usage."""
    out = [ev(TrainerStepCompleted, step=step, kl_to_ref=step / 10)]
    if timed:
        out.append(ev(StepPhaseTimed, step=step, wall_s=10.0))
        out.append(
            ev(
                UsageRecorded,
                step=step,
                pool="trainer",
                phase="train",
                device_kind="gpu",
                device_seconds=80.0,
            )
        )
    return out


def steps(first: int, last: int) -> list[EventBase]:
    return [e for s in range(first, last + 1) for e in trained(s)]


class Log:
    """The controller as hosted: what it derives is appended to the log and read back
    (its own ``PauseRequested`` coming back on the control topic) before what follows,
    unless ``lag`` events come first (the processor's pass delay)."""

    def __init__(self, policy: ControlPolicy | None = None) -> None:
        self.fold = RunControllerFold(policy or ControlPolicy(version="p1"))
        self.state: ControlState = self.fold.initial()
        self.out: list[EventBase] = []
        self.held: list[EventBase] = []

    def feed(self, events: list[EventBase], lag: int = 0) -> list[EventBase]:
        new: list[EventBase] = []
        for e in events:
            if self.held and lag <= 0:
                back, self.held = self.held, []
                new += self._apply(back)
            lag -= 1
            new += self._apply([e])
        return new

    def flush(self) -> list[EventBase]:
        back, self.held = self.held, []
        return self._apply(back)

    def _apply(self, events: list[EventBase]) -> list[EventBase]:
        new: list[EventBase] = []
        for e in events:
            self.state, derived = self.fold.apply(self.state, e)
            new += derived
            self.out += derived
            self.held += [d for d in derived if isinstance(d, PauseRequested)]
        return new


def unanswered(events: list[EventBase]) -> list[EventBase]:
    return [e for e in events if getattr(e, "detector", "") == UNANSWERED]


def started() -> list[EventBase]:
    return [ev(RunSubmitted, step=None, algorithm="grpo"), ev(RunStarted, step=None)]


def test_steps_past_the_pause_page_once_naming_the_run_the_step_and_the_alert() -> None:
    log = Log()
    log.feed([*started(), *steps(0, S), page()])
    pause = [e for e in log.out if isinstance(e, PauseRequested)]
    assert len(pause) == 1
    # counted from the first step read after the request is on the log (S + 1): one step
    # in flight, one for the poll
    quiet = log.feed(steps(S + 1, S + 3))
    assert unanswered(quiet) == []
    fired = log.feed(trained(S + 4))
    assert len(fired) == 1 and isinstance(fired[0], AlertFired)
    a = fired[0]
    assert (a.detector, a.routing, a.layer, a.escalated) == (
        UNANSWERED,
        "page",
        "run_mechanics",
        True,
    )
    assert a.alert_id == f"run-1:{UNANSWERED}:{pause[0].event_id}"
    assert (a.tenant_id, a.run_id, a.step, a.window_start, a.window_end) == (
        "acme",
        "run-1",
        S + 4,
        S,
        S + 4,
    )
    assert dict(a.observed) == {"steps_since_request": 3, "last_step": S + 4}
    assert dict(a.thresholds) == {"pause_unanswered_steps": 2, "pause_unanswered_grace_s": 3.0}
    assert a.config_version == "p1"
    for said in ("run-1", f"step {S}", "3 steps trained since", "kl_blowup", "run-1:kl_blowup:7"):
        assert said in a.reason, (said, a.reason)
    assert "hook.obey" in a.first_response
    # once per request: fifty more steps say nothing more
    assert unanswered(log.feed(steps(S + 5, S + 55))) == []
    assert log.state.phase == "pausing"


def test_only_trainer_step_facts_count_and_a_sparse_row_log_still_counts() -> None:
    """TRL logs a row every ``logging_steps``: its ``StepPhaseTimed`` still comes per step."""
    log = Log()
    log.feed([*started(), page()])
    usage_only = [
        ev(UsageRecorded, step=s, pool="trainer", phase="train", device_kind="gpu",
           device_seconds=1.0)
        for s in range(S + 1, S + 10)
    ]  # fmt: skip
    assert unanswered(log.feed(usage_only)) == []
    timed_only = [ev(StepPhaseTimed, step=s, wall_s=1.0) for s in range(S + 1, S + 5)]
    assert len(unanswered(log.feed(timed_only))) == 1


def test_steps_trained_before_the_request_was_on_the_log_are_not_the_runs_fault() -> None:
    """The processor's pass delay: steps appended between the alert and the request's
    append could not have seen it; N more steps are allowed after the last of them."""
    log = Log()
    log.feed([*started(), page()])
    assert unanswered(log.feed(steps(S + 1, S + 6), lag=3 * 6)) == []  # before it landed
    log.flush()
    assert unanswered(log.feed(steps(S + 7, S + 8))) == []
    fired = unanswered(log.feed(trained(S + 9)))
    assert len(fired) == 1 and dict(fired[0].observed)["steps_since_request"] == 3


def test_replay_re_emits_identical_events() -> None:
    history = [*started(), *steps(0, S), page()]
    after = steps(S + 1, S + 6)
    answer = ev(RunCompleted, step=S + 6)
    runs = []
    for _ in range(2):
        log = Log()
        log.feed(history)
        log.feed(after)
        log.feed([answer])
        runs.append([encode(e) for e in log.out])
    assert runs[0] == runs[1]
    kinds = [json.loads(r)["type"] for r in runs[0]]
    assert kinds == ["PauseRequested", "AlertFired", "AlertResolved"]


def test_the_runs_answer_resolves_the_page() -> None:
    log = Log()
    log.feed([*started(), page(), *steps(S + 1, S + 4)])
    (fired,) = unanswered(log.out)
    request = next(e for e in log.out if isinstance(e, PauseRequested))
    done = log.feed([ev(RunPaused, step=S + 5, request_id=str(request.event_id))])
    assert len(done) == 1 and isinstance(done[0], AlertResolved)
    r = done[0]
    assert (r.alert_id, r.detector, r.step) == (fired.alert_id, UNANSWERED, S + 5)
    assert "paused at step" in r.reason
    assert log.state.phase == "paused" and log.state.waiting is not None
    assert log.state.waiting.held  # watched to stay paused
    # resumed and trained on: nothing more
    assert unanswered(log.feed([ev(RunResumed, step=S + 5), *steps(S + 6, S + 20)])) == []


def test_a_run_that_said_it_paused_and_trains_on_pages() -> None:
    """Found by review: once a run said ``RunPaused`` the controller read none of its
    steps: a loop that says it paused and trains on (``obey()`` on a side thread) billed
    while shown ``PAUSED_BY_GATE`` and nothing noticed. Its own row of the paused step
    (a hook logs after the step's end) is not training on; its resume resolves the page."""
    log = Log()
    log.feed([*started(), page(), *steps(S + 1, S + 2)])
    request = next(e for e in log.out if isinstance(e, PauseRequested))
    log.feed([ev(RunPaused, step=S + 2, request_id=str(request.event_id))])
    assert unanswered(log.feed(trained(S + 2))) == []  # the paused step's own row
    (fired,) = unanswered(log.feed(steps(S + 3, S + 12)))
    assert "said it paused at step 9" in fired.reason and fired.routing == "page"
    assert dict(fired.observed)["last_step"] == S + 5  # 3 past it, 3 s of its clock
    done = log.feed([ev(RunResumed, step=S + 12, request_id="u1")])
    assert [(d.type, d.alert_id) for d in done if isinstance(d, AlertResolved)] == [
        ("AlertResolved", fired.alert_id)
    ]
    # paused and staying put: nothing, however long; its end ends the watch
    log = Log()
    log.feed([*started(), page(), *steps(S + 1, S + 2)])
    request = next(e for e in log.out if isinstance(e, PauseRequested))
    log.feed([ev(RunPaused, step=S + 2, request_id=str(request.event_id))])
    log.feed([ev(RunCancelled, step=S + 2), *steps(S + 2, S + 2)])
    assert unanswered(log.out) == [] and log.state.waiting is None


def test_a_run_that_answered_never_pages() -> None:
    log = Log()
    log.feed([*started(), page()])
    request = next(e for e in log.out if isinstance(e, PauseRequested))
    log.feed([*steps(S + 1, S + 2), ev(RunPaused, step=S + 2, request_id=str(request.event_id))])
    log.feed([ev(RunResumed, step=S + 2), *steps(S + 3, S + 40)])
    assert unanswered(log.out) == []
    # its RunPaused read before its own request came back (another topic): nothing either
    log = Log()
    log.feed([*started(), page()], lag=1_000)
    request = next(e for e in log.out if isinstance(e, PauseRequested))
    log.feed([ev(RunPaused, step=S + 1, request_id=str(request.event_id))], lag=1_000)
    log.flush()
    log.feed([ev(RunResumed, step=S + 1), *steps(S + 2, S + 30)])
    assert unanswered(log.out) == []


def test_a_cancelled_completed_or_failed_run_never_pages() -> None:
    for end in (RunCancelled, RunCompleted, RunFailed):
        log = Log()
        kw: dict[str, Any] = {"reason": "CUDA error"} if end is RunFailed else {}
        log.feed([*started(), page(), *steps(S + 1, S + 2), ev(end, step=S + 2, **kw)])
        log.feed(steps(S - 3, S + 2))  # late steps of the ended run (another topic)
        assert unanswered(log.out) == [], end
        if end is RunFailed:
            log.feed(steps(S + 3, S + 30))  # a restart's, read ahead of its RunStarted
            assert unanswered(log.out) == [] and log.state.waiting is None


def test_a_run_that_trains_on_after_its_end_is_paged_and_gated_again() -> None:
    """Found by review: a hook published ``RunCompleted`` right after a gate's pause
    request and trained 50 steps more: no pause, no page, billed on. Steps after the end
    the run said are training: the request in flight stays watched, and the gates are on."""
    for end in (RunCompleted, RunCancelled):
        log = Log()
        log.feed([*started(), page(), *steps(S + 1, S + 2), ev(end, step=S + 2)])
        assert unanswered(log.out) == [] and log.state.phase == "over"
        log.feed(steps(S + 1, S + 2))  # its last steps, read late: nothing
        assert unanswered(log.out) == [] and log.state.phase == "over"
        fired = unanswered(log.feed(steps(S + 3, S + 6)))
        assert len(fired) == 1, end  # counted from the end: 3 steps trained past it
        assert dict(fired[0].observed)["steps_since_request"] == 3
        assert log.state.phase == "pausing"


def test_an_end_without_a_step_right_after_the_request_still_pages() -> None:
    """The integration's case: the request is the controller's own (not read back yet),
    no step read since, and the hook's ``finish()`` says no step."""
    log = Log()
    log.feed([*started(), *steps(0, S), page()], lag=100)
    log.feed([ev(RunCompleted, step=None)], lag=100)
    log.flush()
    assert unanswered(log.out) == [] and log.state.phase == "over"
    fired = unanswered(log.feed(steps(S + 1, S + 5)))
    assert len(fired) == 1 and log.state.phase == "pausing"


def test_the_last_steps_of_a_run_that_ended_read_late_never_page() -> None:
    """Found by review: a plain hook's ``finish()`` says no step; on Kafka its last step
    facts (telemetry) can be read after its ``RunCompleted`` (lifecycle). Stamped before
    the end, they are the run's last steps, not training after it: no page, still over."""
    log = Log()
    log.feed([*started(), *steps(0, S), page(), *steps(S + 1, S + 1)])
    last = steps(S + 2, S + 9)  # trained before the end, read after it
    log.feed([ev(RunCompleted, step=None, ts=last[-1].ts + 1)])
    assert unanswered(log.feed(last)) == [] and log.state.phase == "over"


def test_an_end_without_a_step_is_judged_on_the_runs_own_clock() -> None:
    """A plain hook's ``finish()`` says no step: a step fact stamped after the end trains
    on, and a page from it pauses the run (its gates are on again)."""
    log = Log()
    log.feed([*started(), *steps(1, S), ev(RunCompleted, step=None)])
    before = [e for e in log.out if isinstance(e, PauseRequested)]
    assert before == [] and log.state.phase == "over"
    log.feed(steps(S + 1, S + 3))  # stamped after the end (the Log's clock moves on)
    assert log.state.phase == "live"
    log.feed([page("run-1:kl_blowup:11", step=S + 4)])
    assert len([e for e in log.out if isinstance(e, PauseRequested)]) == 1


def test_a_page_from_after_the_end_read_ahead_of_its_step_pauses() -> None:
    log = Log()
    log.feed([*started(), *steps(1, S), ev(RunCompleted, step=S)])
    log.feed([page("run-1:kl_blowup:9", step=S + 2)])  # alerts read ahead of telemetry
    assert len([e for e in log.out if isinstance(e, PauseRequested)]) == 1
    log2 = Log()
    log2.feed([*started(), *steps(1, S), ev(RunCompleted, step=S)])
    log2.feed([page("run-1:kl_blowup:7", step=S)])  # from before the end: nothing
    assert [e for e in log2.out if isinstance(e, PauseRequested)] == []


def test_the_end_of_a_run_that_paged_resolves_it() -> None:
    log = Log()
    log.feed([*started(), page(), *steps(S + 1, S + 10)])
    done = log.feed([ev(RunCompleted, step=S + 10)])
    assert [type(d) for d in done] == [AlertResolved] and "completed" in done[0].reason


def test_an_unpause_before_the_answer_withdraws_it() -> None:
    log = Log()
    log.feed([*started(), page(), *steps(S + 1, S + 5)])
    assert len(unanswered(log.out)) == 1
    done = log.feed([ev(UnpauseRequested, step=None, actor="operator", principal="alice")])
    assert [type(d) for d in done] == [AlertResolved] and "withdrawn" in done[0].reason
    assert unanswered(log.feed(steps(S + 6, S + 30))) == []


def test_an_old_pause_after_a_restart_or_resume_cycle_does_not_page() -> None:
    """The request read again after the run answered it, or after it failed and was
    restarted (its process says RunStarted / RunResumed), or a stale copy of it read late
    on Kafka: the run trained on legitimately, nothing pages."""
    # failed while pausing, restarted, trains on
    log = Log()
    log.feed([*started(), page(), *steps(S + 1, S + 2)], lag=1_000)
    request = next(e for e in log.out if isinstance(e, PauseRequested))
    log.feed([ev(RunFailed, step=S + 2, reason="OOM"), ev(RunStarted, step=None)], lag=1_000)
    log.flush()  # the old request read back after the restart
    # its page still open, the restart is asked to pause again (owed: a new request)
    again = [e for e in log.out if isinstance(e, PauseRequested) and e is not request]
    assert len(again) == 1 and again[0].alert_id == request.alert_id
    log.feed([ev(RunPaused, step=S + 3, request_id=str(again[0].event_id))])
    log.feed([ev(RunResumed, step=S + 3), *steps(S + 3, S + 40)])
    log.feed([request])  # and again (a redelivery)
    log.feed(steps(S + 41, S + 50))
    assert unanswered(log.out) == []
    # paused, resumed; the old request read again much later
    log = Log()
    log.feed([*started(), page()])
    request = next(e for e in log.out if isinstance(e, PauseRequested))
    log.feed([ev(RunPaused, step=S + 1, request_id=str(request.event_id))])
    log.feed([ev(RunResumed, step=S + 1), *steps(S + 2, S + 10), request, *steps(S + 11, S + 30)])
    assert unanswered(log.out) == []
    # a restarted trainer that says RunResumed while the pause was in flight: a new start
    log = Log()
    log.feed([*started(), page(), ev(RunResumed, step=3), *steps(4, 40)])
    assert unanswered(log.out) == []


def test_a_persons_pause_unanswered_pages_too() -> None:
    """A person's pause has no step: the first step after it was in flight; N after it."""
    log = Log()
    log.feed([*started(), *steps(0, 20)])
    pause = ev(PauseRequested, step=None, actor="operator", principal="alice", reason="maint")
    log.feed([pause, *steps(21, 23)])
    assert unanswered(log.out) == []
    fired = unanswered(log.feed(trained(24)))
    assert len(fired) == 1
    assert "operator alice: maint" in fired[0].reason and "after step 21" in fired[0].reason


def test_its_own_page_is_not_a_pausing_alert_and_the_policy_sets_n() -> None:
    policy = ControlPolicy(version="p", pause_unanswered_steps=5)
    log = Log(policy)
    log.feed([*started(), page(), *steps(S + 1, S + 6)])
    assert unanswered(log.out) == []
    (fired,) = unanswered(log.feed(trained(S + 7)))
    before = log.state
    assert log.feed([fired]) == [] and log.state.pending == before.pending  # read back
    assert log.state.owed == before.owed and log.state.acted == before.acted
    # per tenant
    layered = ControlPolicy.model_validate({"tenants": {"acme": {"pause_unanswered_steps": 1}}})
    assert layered.unanswered_after(tenant="acme", algorithm="grpo") == (1, 3.0)
    assert layered.unanswered_after(tenant="other", algorithm="grpo") == (2, 3.0)
    packaged = ControlPolicy.load()
    assert (packaged.pause_unanswered_steps, packaged.pause_unanswered_grace_s) == (2, 3.0)


def test_the_state_round_trips_and_an_old_state_loads() -> None:
    f = RunControllerFold(ControlPolicy())
    log = Log()
    log.feed([*started(), page(), *steps(S + 1, S + 4)])
    assert log.state.waiting is not None and log.state.waiting.fired
    assert f.load_state(f.dump_state(log.state)) == log.state
    # stored before 2026-11-29 (eight fields): no request watched; a completed run stays over
    old = json.dumps(["grpo", "pausing", ["a"], "controller", [], [], [], None]).encode()
    assert f.load_state(old).waiting is None and f.load_state(old).phase == "pausing"
    over = json.dumps(["grpo", "over", [], "", [], [], [], 12]).encode()
    assert f.load_state(over).phase == "over"
    # stored before 2026-11-28 (tenth: nine fields): the step it holds is an old pause's,
    # not the end's, so a late fact of the completed run must not revive it (review)
    done = json.dumps(["grpo", "over", [], "", [], [], [], 100, None]).encode()
    state = f.load_state(done)
    assert state.phase == "over" and state.paused_step is None and state.ended_ts is None
    for late in (trained(450), [page("run-1:kl_blowup:450", step=450)]):
        after, derived = state, []
        for e in late:
            after, out = f.apply(after, e)
            derived += out
        assert after.phase == "over" and derived == []


def test_a_step_of_a_run_not_pausing_leaves_the_state_as_it_is() -> None:
    """The controller sees every step of every run: O(1), no new state object."""
    f = RunControllerFold(ControlPolicy())
    state = f.initial()
    for e in [*started()]:
        state, _ = f.apply(state, e)
    for e in steps(0, 200):
        after, out = f.apply(state, e)
        assert after is state and out == ()


def test_fast_steps_get_the_grace_of_the_runs_own_clock() -> None:
    """A loop of 0.1 s steps that obeys is paused 3-4 steps after the request landed (the
    hook's 0.5 s command poll, its 0.2 s publishing): more than 2 steps, not a page. The
    grace is measured on the step facts' ``ts`` (the run's clock), never the host's."""
    log = Log()
    log.feed(started())
    t0 = 1_000.0
    alert = page().model_copy(update={"ts": t0})
    fast = [
        e.model_copy(update={"ts": t0 + 0.1 * (s - S)}) for s in range(S + 1, S + 40)
        for e in trained(s)
    ]  # fmt: skip
    log.feed([alert])
    quiet = log.feed(fast[: 3 * 30])  # to step S + 30: 2.9 s of the run's clock past S + 1
    assert unanswered(quiet) == []
    fired = unanswered(log.feed(fast[3 * 30 :]))
    assert len(fired) == 1 and fired[0].step in (S + 31, S + 32)  # 3.0 s past S + 1


def test_a_gates_alert_from_a_backlog_counts_from_the_runs_own_steps() -> None:
    """Found by review (2026-11-28): a gate's request was counted from its alert's step.
    An alert read from a backlog (the processors catching up after a restart, a hook's
    spool shipped after an outage) is far behind the run: an obeying run that paused at
    the end of the step in flight was paged for 81 steps. Now counted from the run's own
    step facts read after the request."""
    log = Log()
    log.feed([*started(), *steps(0, 100)])  # the run is at step 100 ...
    log.feed([page("run-1:kl_blowup:20", step=20)])  # ... when its step 20 pages
    assert [type(e) for e in log.out] == [PauseRequested]
    assert unanswered(log.feed(trained(101))) == []  # in flight when the request landed
    assert unanswered(log.feed([ev(RunPaused, step=101)])) == []
    assert unanswered(log.out) == [] and log.state.phase == "paused"
