"""RunControllerFold: a paging alert becomes a ``PauseRequested`` (pure fold, per run).

Inputs: ``runwatch.alerts`` (``AlertFired``), ``runwatch.lifecycle`` (the algorithm from
``RunSubmitted``; whether the run is paused or over, from the trainer's own answers),
``runwatch.control`` (requests already made, by anyone) and ``runwatch.telemetry`` (the
run's step facts: a pause nobody answers, below). Key: ``run_id``. Output:
``PauseRequested(actor="controller")`` on ``runwatch.control``, with a deterministic id
(``derived_id(producer, alert event id, "pause")``), the alert's ``ts`` and ``step``, the
alert id and the policy version; and ``AlertFired`` / ``AlertResolved``
(``pause_unanswered``) on ``runwatch.alerts``.

Rules:

- An ``AlertFired`` pauses when :meth:`ControlPolicy.pauses` says so for the run's tenant,
  algorithm, detector and routing (``page`` by default: ``ticket`` and ``advisory`` never
  pause), the run is live (not already pausing, paused or over), and this alert episode
  (``alert_id``) has not paused the run before — a run a person resumed while the same
  alert is still active is not paused again by it; a new episode pauses again.
- A pausing alert that fires while the run is pausing or paused:

  - under the controller's own pause (a gate's), it is the gate's business: the run is
    stopped, and whoever resumes it answers the gate with every open alert in view (the
    API and the dashboard show them), so the resume covers it — unless it fired from a
    step after the one the run paused at: that step was trained after a resume this fold
    has not read yet (Kafka orders no two topics: the alerts topic can be read ahead of
    the lifecycle's ``RunResumed``), so nobody resuming saw it, and it is owed (found by
    review: such a page was dropped, and the run trained on);
  - under a person's pause (maintenance, a question), it is *owed*: nobody resuming that
    pause was answering it, so when the run is live again (``RunResumed``, or an unpause
    before the trainer paused) the controller asks for a pause for the owed alerts still
    open (one request, naming them; derived from the event that made the run live). An
    owed alert that resolves first is not owed any more. (Before 2026-11-27 such an alert
    was dropped: a maintenance pause and resume let the run train on past a page.)

  Whose pause is in effect is whose request the trainer's ``RunPaused`` answered (its
  ``request_id``; none: nobody's gate). A request of the controller's that the trainer
  ignored (a person's pause was ahead of it) leaves its alerts owed too, and those that
  fired while it was unanswered. (A person's unpause while the pause is in flight can
  make the controller ask twice for one owed alert: the trainer ignores the second, a
  pause of a paused run.)
- A pause request by anyone makes the run "pausing" until the trainer answers
  ``RunPaused``; ``RunResumed`` makes it live again; ``RunCompleted`` and ``RunCancelled``
  end it (later alerts do nothing) — unless a step fact from a step after the end is read:
  the run trains on, so it is live again, gates included, and a pause request in flight
  at the end stays watched (``pause_unanswered`` below counts from the end). (Found by
  review: a hook that published ``RunCompleted`` right after a gate's pause request, then
  trained 50 steps more, was never paused nor paged.) "After the end" is after the step
  the end names, or, naming none (a plain hook's ``finish()``), stamped after it on the
  run's own clock: the run's last steps read late (another topic) are not training after
  it. Both are the run's own word, as every fact of a hooked run is: a job that lies
  about its end (a far-future step or time) hides the training it reports after it, as
  a job that stops reporting hides all of it; stopping such a job is its scheduler's.
  A completed run is also live again on a ``RunSubmitted``/``RunStarted``/``RunResumed``/
  ``RunPaused`` of its process stamped after the end (a framework's second ``train()``,
  whose steps start again at 0: :func:`_reopened`); a cancelled run is not.
  ``RunFailed`` ends it too, until a process trains it again: a failed run may be
  restarted (``runwatch resume``, a requeued hooked job), and its restart's
  ``RunStarted``/``RunResumed`` (or ``RunPaused``: restarted still paused) makes it live
  again, gates included. A pausing alert read while the run is failed is owed, asked for
  when the run is live — whatever its step: one from after the failure is the restart's,
  read ahead of the restart's own fact (another topic), and one from before it was read
  late (the embedded host folds the alerts a pass after the facts they came from, so a
  crash in the same batch as the page was read first: found by review, the page was
  dropped and the restart trained on at the blown-up KL); so are the alerts of a gate's
  pause request the failure left unanswered, and those owed when it failed; an alert that
  resolves meanwhile is not owed any more.
  (Before 2026-11-28 a failed run stayed ended: its restart trained with every gate off
  — 186 steps billed after a page in the review's run.) A state stored before then says
  ``over`` for a failed run too: it loads as ``failed`` (a restart reopens it; a
  completed run's state stored then has no ``ended_by``: only its steps after the end
  reopen it, as before).

- **A pause nobody answers pages.** The fold also reads the run's step facts
  (``TrainerStepCompleted``, ``StepPhaseTimed`` on ``runwatch.telemetry``). A pause
  request (the controller's or a person's) makes the run "pausing"; once the request is on
  the log (read back here: steps trained before the run could see it are not its fault), a
  run that trains more than ``pause_unanswered_steps`` (policy, 2 by default) past the
  last step fact read while the request was in flight (or, none, the first one read after
  it was on the log: never the alert's own step, which may be far behind the run when the
  processors catch up a backlog or a hook's spool ships), and at least
  ``pause_unanswered_grace_s`` (3 s) of its own clock (the step facts' ``ts``) after that
  step (a hook answers within a step plus its command poll, 0.5 s, and
  publishes its facts every 0.2 s: a loop of 0.1 s steps is paused 3-4 steps after the
  request landed), with no ``RunPaused``, derives one
  ``AlertFired(detector="pause_unanswered", routing="page", escalated=True)`` per request
  (id ``<run>:pause_unanswered:<request id>``, deterministic) naming the run, the
  requested step, the steps trained since and who asked and why (the alert that caused a
  gate's pause): the notifier sends it to the tenant's webhook, the exporter's
  ``runwatch_alerts_fired_total`` to Alertmanager's paging receiver. It resolves when the
  run leaves "pausing": ``RunPaused`` (it answered), ``RunResumed``, an unpause before the
  answer (the pause was withdrawn), or the run's end. (Found by review: a loop that never
  called ``hook.obey()`` — the documented plain-hook loop — trained and billed 52 steps
  past a gate's pause and nothing noticed.) It is not a pausing alert itself (the run is
  pausing already). Cost: a step fact of a run that is not pausing is one type lookup and
  one comparison, the state untouched (and the host keeps no id of it:
  ``replayable_inputs``); while a request is in flight and not on the log
  yet, each step replaces the state (bounded by the processor's lag). On Kafka the topics
  are read in no common order: steps trained after a resume can be read before the
  ``RunPaused`` and its ``RunResumed`` (a consumer far behind on the lifecycle) and page
  wrongly; the late ``RunPaused`` resolves it. A state stored before 2026-11-29 mid-pause
  loads with its request not watched (the next one is).

- **A run that said it paused and trains on pages too** (the same ``pause_unanswered``
  page, its id naming the ``RunPaused``): from its ``RunPaused`` the run is watched the
  same way, counted past the paused step on its own clock, until it resumes, fails or
  ends. (Found by review: once a run said ``RunPaused`` none of its steps were read, so a
  loop that said it paused and trained on — ``obey()`` on a side thread — billed while
  shown ``PAUSED_BY_GATE``.) The same caveat on Kafka: steps after a resume read before
  the ``RunResumed`` may page, and the ``RunResumed`` resolves it.

The fold does not judge people's commands (the API does, against the projected state, and
the trainer ignores what does not apply to it); it only avoids asking twice. Time: event
fields only. State: one small NamedTuple per run (and one for the request in flight).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

from events.catalog.control import PauseRequested, UnpauseRequested
from events.catalog.derived import AlertFired, AlertResolved
from events.catalog.lifecycle import (
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunResumed,
    RunStarted,
    RunSubmitted,
)
from events.catalog.trainer import StepPhaseTimed, TrainerStepCompleted
from events.envelope import EventBase, derive_envelope, derived_id
from stream_processors.control.policy import ControlPolicy

PRODUCER = "stream_processors/run_controller"
#: How many alert episodes a run remembers having paused for.
MAX_ACTED = 64


class Owed(NamedTuple):
    """A pausing alert that fired under a person's pause (see the module docstring)."""

    alert_id: str
    detector: str
    routing: str
    reason: str


class Waiting(NamedTuple):
    """A pause request the run has not answered yet (see the module docstring)."""

    request_id: str
    #: the step it was requested at (None: not said, a person's)
    asked_step: int | None
    #: steps are counted past this one: the last step fact read while the request was in
    #: flight, else the first read after it was on the log (None: none read yet)
    since: int | None
    #: the run's own clock at ``since`` (that step fact's ``ts``)
    since_ts: float
    #: whether the request is on the log yet (read back): the run can see it
    on_log: bool
    #: who asked and why (a gate's: the alert that caused it), for the page
    why: str
    #: the ``pause_unanswered`` alert fired for it ('' none yet)
    fired: str = ""
    #: the run answered (``RunPaused``): watched to stay paused (``request_id`` is then
    #: the ``RunPaused``'s id, ``since`` its step)
    held: bool = False


class ControlState(NamedTuple):
    algorithm: str = "default"
    phase: str = "live"  # live | pausing | paused | over | failed (over until restarted)
    acted: tuple[str, ...] = ()  # alert ids this controller paused the run for
    #: who asked for the pause in effect: "controller" (a gate) or "person"
    paused_by: str = ""
    #: pausing alerts that fired under a person's pause, oldest first
    owed: tuple[Owed, ...] = ()
    #: recent pause requests as (request id, "controller" | "person"): who a ``RunPaused``
    #: answered (its ``request_id``) decides whose pause is in effect
    asked: tuple[tuple[str, str], ...] = ()
    #: the alerts of this controller's pause request not answered yet: owed if the trainer
    #: answers a person's pause instead (it ignores a pause of a paused run)
    pending: tuple[Owed, ...] = ()
    #: the step of the ``RunPaused`` in effect (an alert from a later step is not under
    #: it), or of the ``RunFailed`` (an alert from a later step is its restart's), or of
    #: the run's end (``RunCompleted`` / ``RunCancelled``: a later step trains on)
    paused_step: int | None = None
    #: the pause request in flight, watched for an answer (None: not pausing)
    waiting: Waiting | None = None
    #: the run's own clock at its end (``RunCompleted`` / ``RunCancelled``'s ``ts``): with
    #: no end step said, a step fact stamped later trains on (None: not ended)
    ended_ts: float | None = None
    #: how it ended: "completed" (its process may train it again: :func:`_reopened`),
    #: "cancelled", or "" (not ended; or a state stored before this field)
    ended_by: str = ""


class RunControllerFold:
    """Implements :class:`events.fold.Fold` for run control."""

    name = "run-controller"
    inputs: tuple[str, ...] = (
        "runwatch.lifecycle",
        "runwatch.alerts",
        "runwatch.control",
        "runwatch.telemetry",  # the run's steps: a pause nobody answers
    )
    #: a step fact folded twice changes nothing (its page is once per request, its count
    #: only moves forward): hosts keep no ids of them, which would crowd the window that
    #: guards the lifecycle and control facts (:func:`runwatch.hosting.core.untracked_topics`)
    replayable_inputs: tuple[str, ...] = ("runwatch.telemetry",)

    def __init__(self, policy: ControlPolicy | None = None) -> None:
        self.policy = policy or ControlPolicy.load()

    def initial(self) -> ControlState:
        return ControlState()

    def key_of(self, event: EventBase) -> str:
        return event.run_id

    def apply(
        self, state: ControlState, event: EventBase
    ) -> tuple[ControlState, Sequence[EventBase]]:
        t = type(event)
        if t in _STEP_FACTS:  # every step of every run: O(1), the state untouched unless
            if state.phase == "over":  # a pause is in flight and not paged yet (or the
                state = _trains_after_end(state, event)  # run said it ended: below)
                if state.phase == "over":  # a fact from before the end: not counted
                    return state, ()
            w = state.waiting
            if w is None or w.fired:
                return state, ()
            return self._trained(state, w, event)
        if t not in _INPUTS:  # the telemetry this fold does not read
            return state, ()
        if state.phase == "over" and t in _RESTARTS:
            state = _reopened(state, event)  # a completed run trained again
            if state.phase != "over" and (t is RunSubmitted or t is RunStarted):
                if t is RunSubmitted:
                    state = state._replace(algorithm=event.algorithm)  # type: ignore[attr-defined]
                if state.phase == "live":  # pages read ahead of it are owed
                    return self._live(state, event)
                return state, ()
        if t is AlertFired:
            return self._alert(state, event)  # type: ignore[arg-type]
        if state.phase == "over":
            w = state.waiting  # a request watched past the end, read back: the run sees it
            if t is PauseRequested and w is not None and w.request_id == str(event.event_id):
                return state._replace(waiting=w._replace(on_log=True)), ()
            return state, ()
        if state.phase == "failed":  # over, unless a process trains the run again
            if t is AlertResolved and state.owed:  # ended: not owed to a restart any more
                gone = event.alert_id  # type: ignore[attr-defined]
                return state._replace(owed=tuple(o for o in state.owed if o.alert_id != gone)), ()
            if t not in _RESTARTS:
                return state, ()
            state = state._replace(phase="live", paused_by="", paused_step=None)
            if t is RunSubmitted:
                state = state._replace(algorithm=event.algorithm)  # type: ignore[attr-defined]
            if t is RunSubmitted or t is RunStarted:  # pages read ahead of it are owed
                return self._live(state, event)
        if t is AlertResolved and (state.owed or state.pending):  # ended: not owed any more
            gone = event.alert_id  # type: ignore[attr-defined]
            return state._replace(
                owed=tuple(o for o in state.owed if o.alert_id != gone),
                pending=tuple(o for o in state.pending if o.alert_id != gone),
            ), ()
        if t is RunSubmitted:
            return state._replace(algorithm=event.algorithm), ()  # type: ignore[attr-defined]
        if t is PauseRequested:
            rid = str(event.event_id)
            if any(r == rid for r, _ in state.asked):  # ours coming back, or answered already
                w = state.waiting  # (its RunPaused read first: another topic)
                if w is not None and w.request_id == rid and not w.on_log:
                    return state._replace(waiting=w._replace(on_log=True)), ()  # run sees it
                return state, ()
            by = "controller" if event.actor == "controller" else "person"  # type: ignore[attr-defined]
            asked = _remember(state.asked, rid, by)
            if state.phase == "live":
                waiting = _waiting(event, on_log=True)  # type: ignore[arg-type]
                state = state._replace(phase="pausing", paused_by=by, asked=asked, waiting=waiting)
                return state, ()
            return state._replace(asked=asked), ()
        if t is RunPaused:
            # whose request the trainer answered (none: the reward's failure policy, a
            # restarted trainer still paused: nobody's gate)
            rid = event.request_id  # type: ignore[attr-defined]
            kept = state.paused_by if state.phase == "paused" else ""  # re-said after a restart
            by = (dict(state.asked).get(rid, "") if rid else kept) or "person"
            owed = state.owed
            if by == "person" and state.pending:  # our request came after it: ignored
                owed = (*owed, *(p for p in state.pending if p not in owed))[-MAX_ACTED:]
            asked = _remember(state.asked, rid, by) if rid else state.asked
            state, done = self._answered(state, event, f"the run paused at step {event.step}")
            state = state._replace(phase="paused", paused_by=by, owed=owed, pending=())
            held = _held(event)  # it said it stopped: steps past it are watched
            return state._replace(asked=asked, paused_step=event.step, waiting=held), done
        if t is RunResumed or (t is UnpauseRequested and state.phase == "pausing"):
            why = "the run said it resumed" if t is RunResumed else "the pause was withdrawn"
            state, done = self._answered(state, event, why)
            state, request = self._live(state._replace(phase="live", paused_by=""), event)
            return state, (*done, *request)
        if t is RunFailed:  # its open pages stay owed to a restart (module docstring)
            state, done = self._answered(state, event, "the run failed")
            owed = (*state.owed, *(p for p in state.pending if p not in state.owed))
            return state._replace(
                phase="failed", owed=owed[-MAX_ACTED:], pending=(), paused_step=event.step
            ), done
        if t is RunCompleted or t is RunCancelled:
            ended_by = "completed" if t is RunCompleted else "cancelled"
            w = state.waiting
            end = event.step  # None (a plain hook's finish()): judged on its clock alone
            if w is not None and not w.fired and not w.held:
                # a pause in flight stays watched past the end the run said: a run that
                # trains on after it did not stop (steps up to its end were its last)
                since = w.since if end is None or w.since is None else max(w.since, end)
                since = end if since is None else since
                return state._replace(
                    phase="over",
                    owed=(),
                    paused_step=end,
                    waiting=w._replace(since=since),
                    ended_ts=event.ts,
                    ended_by=ended_by,
                ), ()
            why = "the run completed" if t is RunCompleted else "the run was cancelled"
            state, done = self._answered(state, event, why)
            return state._replace(
                phase="over", owed=(), paused_step=end, ended_ts=event.ts, ended_by=ended_by
            ), done
        return state, ()  # CancelRequested: the run ends when the trainer says so

    def _live(
        self, state: ControlState, cause: EventBase
    ) -> tuple[ControlState, Sequence[EventBase]]:
        """The run is live again: one pause for the alerts owed to it, if any are open."""
        owed = state.owed
        if not owed:
            return state, ()
        names = "; ".join(f"{o.detector} ({o.routing}): {o.reason}" for o in owed)
        request = PauseRequested(
            **derive_envelope(cause, PRODUCER, "pause", *(o.alert_id for o in owed)),
            actor="controller",
            principal=PRODUCER,
            reason=f"fired while a person had the run paused, still open: {names}",
            alert_id=owed[0].alert_id,
            policy_version=self.policy.version,
        )
        acted = (*state.acted, *(o.alert_id for o in owed))[-MAX_ACTED:]
        asked = _remember(state.asked, str(request.event_id), "controller")
        state = state._replace(
            phase="pausing",
            paused_by="controller",
            acted=acted,
            owed=(),
            asked=asked,
            pending=owed,
            waiting=_waiting(request, on_log=False),
        )
        return state, (request,)

    def _alert(
        self, state: ControlState, ev: AlertFired
    ) -> tuple[ControlState, Sequence[EventBase]]:
        if state.phase == "over" and _after(ev, state.paused_step):  # trained after its end
            state = _trains_after_end(state, ev)  # (read ahead of that step's own fact)
        if _after_completion(state, ev) and ev.detector != UNANSWERED:
            # a page of a completed run trained again read ahead of the fact that reopens
            # it (another topic; its steps start again at 0): owed when it does
            pauses = self.policy.pauses(tenant=ev.tenant_id, algorithm=state.algorithm,
                                        detector=ev.detector, routing=ev.routing)  # fmt: skip
            if pauses and all(o.alert_id != ev.alert_id for o in state.owed):
                this = Owed(ev.alert_id, ev.detector, ev.routing, ev.reason)
                return state._replace(owed=(*state.owed, this)[-MAX_ACTED:]), ()
            return state, ()
        if state.phase == "over" or ev.alert_id in state.acted or ev.detector == UNANSWERED:
            return state, ()  # (ours: the run is pausing already)
        if not self.policy.pauses(
            tenant=ev.tenant_id, algorithm=state.algorithm, detector=ev.detector, routing=ev.routing
        ):
            return state, ()
        if state.phase == "failed":  # owed to its restart, whatever its step (docstring)
            if all(o.alert_id != ev.alert_id for o in state.owed):
                this = Owed(ev.alert_id, ev.detector, ev.routing, ev.reason)
                return state._replace(owed=(*state.owed, this)[-MAX_ACTED:]), ()
            return state, ()
        if state.phase != "live":  # pausing or paused: the gate's own, or owed (docstring)
            this = Owed(ev.alert_id, ev.detector, ev.routing, ev.reason)
            if any(o.alert_id == ev.alert_id for o in (*state.owed, *state.pending)):
                return state, ()
            if state.paused_by == "controller":
                if state.phase == "pausing" and state.pending:  # our request not answered
                    return state._replace(pending=(*state.pending, this)[-MAX_ACTED:]), ()
                if not _after(ev, state.paused_step if state.phase == "paused" else None):
                    return state, ()  # under the gate's own pause: the resume covers it
            return state._replace(owed=(*state.owed, this)[-MAX_ACTED:]), ()
        request = PauseRequested(
            **derive_envelope(ev, PRODUCER, "pause"),
            actor="controller",
            principal=PRODUCER,
            reason=f"{ev.detector} ({ev.routing}): {ev.reason}",
            alert_id=ev.alert_id,
            policy_version=self.policy.version,
        )
        acted = (*state.acted, ev.alert_id)[-MAX_ACTED:]
        state = state._replace(
            phase="pausing",
            paused_by="controller",
            acted=acted,
            asked=_remember(state.asked, str(request.event_id), "controller"),
            pending=(Owed(ev.alert_id, ev.detector, ev.routing, ev.reason),),
            waiting=_waiting(request, on_log=False),
        )
        return state, (request,)

    # -- a pause nobody answers (see the module docstring) --------------------------------
    def _trained(
        self, state: ControlState, w: Waiting, ev: EventBase
    ) -> tuple[ControlState, Sequence[EventBase]]:
        """A step fact while a pause request is in flight and not paged yet."""
        step = ev.step
        if step is None:
            return state, ()
        since = w.since
        if not w.on_log or since is None:  # not on the log yet: the run cannot see it (or
            if since is None or step > since:  # none read since it was: this one was in flight)
                return state._replace(waiting=w._replace(since=step, since_ts=ev.ts)), ()
            return state, ()
        allowed, grace = self.policy.unanswered_after(
            tenant=ev.tenant_id, algorithm=state.algorithm
        )
        if step <= since + allowed or ev.ts - w.since_ts < grace:
            return state, ()
        aid = f"{ev.run_id}:{UNANSWERED}:{w.request_id}"
        asked = w.asked_step if w.asked_step is not None else since
        trained = step - since  # past the step it could first be seen at
        at = f"at step {w.asked_step}" if w.asked_step is not None else f"after step {since}"
        reason = (
            f"run {ev.run_id} did not answer the pause requested {at} ({w.why}): "
            f"{trained} steps trained since it was on the log (to step {step}), no "
            "RunPaused: it trains and bills on"
        )
        if w.held:
            reason = (
                f"run {ev.run_id} said it paused at step {since} ({w.why}) and trains on: "
                f"{trained} steps since (to step {step}) while it is shown paused: it "
                "bills on"
            )
        alert = AlertFired(
            event_id=derived_id(PRODUCER, ev.run_id, aid, "fired"),
            tenant_id=ev.tenant_id,
            run_id=ev.run_id,
            step=step,
            ts=ev.ts,
            producer=PRODUCER,
            seq=0,
            alert_id=aid,
            detector=UNANSWERED,
            layer="run_mechanics",
            routing="page",
            window_start=asked,
            window_end=step,
            observed=(("steps_since_request", trained), ("last_step", step)),
            thresholds=(("pause_unanswered_steps", allowed), ("pause_unanswered_grace_s", grace)),
            config_version=self.policy.version,
            reason=reason,
            first_response=UNANSWERED_RESPONSE,
            escalated=True,
        )
        return state._replace(waiting=w._replace(fired=aid)), (alert,)

    def _answered(
        self, state: ControlState, cause: EventBase, why: str
    ) -> tuple[ControlState, tuple[EventBase, ...]]:
        """The run left "pausing" (or was never in it): no request in flight any more; the
        ``pause_unanswered`` page of the one that was, resolved."""
        w = state.waiting
        if w is None:
            return state, ()
        state = state._replace(waiting=None)
        if not w.fired:
            return state, ()
        resolved = AlertResolved(
            event_id=derived_id(PRODUCER, cause.run_id, w.fired, "resolved"),
            tenant_id=cause.tenant_id,
            run_id=cause.run_id,
            step=cause.step,
            ts=cause.ts,
            producer=PRODUCER,
            seq=0,
            alert_id=w.fired,
            detector=UNANSWERED,
            reason=f"{why} ({cause.type})",
            config_version=self.policy.version,
        )
        return state, (resolved,)

    def dump_state(self, state: ControlState) -> bytes:
        owed = [list(o) for o in state.owed]
        asked = [list(a) for a in state.asked]
        pending = [list(o) for o in state.pending]
        return json.dumps(
            [
                state.algorithm,
                state.phase,
                list(state.acted),
                state.paused_by,
                owed,
                asked,
                pending,
                state.paused_step,
                None if state.waiting is None else list(state.waiting),
                state.ended_ts,
                state.ended_by,
            ]
        ).encode()

    def load_state(self, raw: bytes) -> ControlState:
        """A state stored before owed alerts (three fields) loads with none owed and the
        pause in effect taken as a gate's (what it was treated as then); one stored before
        a later field loads with that field's default."""
        algorithm, phase, acted, *rest = json.loads(raw)
        gate = "controller" if phase in ("pausing", "paused") else ""
        defaults = [gate, [], [], [], None, None, None, ""]  # fields added later
        paused_by, owed, asked, pending, paused_step, waiting, ended_ts, ended_by = [
            *rest,
            *defaults[len(rest) :],
        ]
        if phase == "over" and len(rest) < _ENDED_SINCE:  # stored before the end's step was
            paused_step = None  # kept: what it holds is an old pause's step, not the end's
        if phase == "over" and len(rest) < _FAILED_SINCE:  # stored before "failed" was
            phase = "failed"  # told apart: a restart reopens it (an old completed run's
            # state has no ended_by: only steps after its end reopen it, as before)
        return ControlState(
            algorithm,
            phase,
            tuple(acted),
            paused_by,
            tuple(Owed(*o) for o in owed),
            tuple((str(a[0]), str(a[1])) for a in asked),
            tuple(Owed(*o) for o in pending),
            paused_step,
            None if waiting is None else Waiting(*waiting),
            ended_ts,
            ended_by,
        )


def _trains_after_end(state: ControlState, ev: EventBase) -> ControlState:
    """A step fact of a run that said it ended (``RunCompleted`` / ``RunCancelled`` at
    ``paused_step``; none said: stamped after it, ``ended_ts``): one from a later step means
    it trains on, so it is live again, its gates included (found by review: a hook's
    ``RunCompleted`` turned every gate of a run off while it trained and billed on). Steps
    up to the end (late facts of the ended run, read from another topic) change nothing."""
    end, step = state.paused_step, ev.step
    if end is not None:
        if step is None or step <= end:
            return state
    elif state.ended_ts is None or ev.ts <= state.ended_ts:
        return state  # no end step said: judged on the run's own clock
    if state.waiting is not None:  # a pause in flight at the end still stands
        return state._replace(phase="pausing", paused_step=None, ended_ts=None, ended_by="")
    return state._replace(phase="live", paused_by="", paused_step=None, ended_ts=None,
                          ended_by="")  # fmt: skip


def _reopened(state: ControlState, ev: EventBase) -> ControlState:
    """A completed run its process trains again: a lifecycle fact of a restart
    (``RunSubmitted``/``RunStarted``/``RunResumed``/``RunPaused``) stamped after the end
    on the run's own clock makes it live again, gates included. Found by review: a
    framework's second ``train()`` starts its steps again at 0, so none of them came
    "after the end's step" and every page of that stage was dropped (no pause ever
    asked). A cancelled run stays over; a fact stamped before the end (a late one of the
    ended run) changes nothing. Left: on Kafka a page of that stage read ahead of the
    fact that reopens it (another topic) is dropped like any page of an ended run."""
    if not _after_completion(state, ev):
        return state
    if state.waiting is not None:  # a pause in flight at the end stands, still whose it was
        return state._replace(phase="pausing", paused_step=None, ended_ts=None, ended_by="")
    return state._replace(phase="live", paused_by="", paused_step=None, ended_ts=None,
                          ended_by="")  # fmt: skip


def _after_completion(state: ControlState, ev: EventBase) -> bool:
    """Is ``ev`` stamped after the run's completion (its process training it again)?"""
    return (
        state.phase == "over"
        and state.ended_by == "completed"
        and state.ended_ts is not None
        and ev.ts > state.ended_ts
    )


def _after(ev: AlertFired, paused_step: int | None) -> bool:
    """Did ``ev`` fire from a step after the one the run paused at (so trained after a
    resume)? Unknown steps: no (the pause covers it, as before)."""
    step = ev.step if ev.step is not None else ev.window_end
    return paused_step is not None and step is not None and step > paused_step


def _why(request: PauseRequested) -> str:
    """Who asked for a pause and why, as the page names it (bounded)."""
    if request.actor == "controller":
        cause = f"alert {request.alert_id}: " if request.alert_id else ""
        return f"by the controller for {cause}{request.reason}"[:300]
    who = f"{request.actor} {request.principal}".strip()
    return f"by {who}: {request.reason or 'no reason given'}"[:300]


def _waiting(request: PauseRequested, *, on_log: bool) -> Waiting:
    """A pause request to watch, counted from step facts read after it (never from its
    alert's step: a gate's alert may come from a backlog far behind the run, review
    2026-11-28: a healthy run that obeyed at once was paged for 81 steps), so the steps
    and the grace are measured on the run's own facts alone."""
    return Waiting(str(request.event_id), request.step, None, 0.0, on_log, _why(request))


def _held(paused: RunPaused) -> Waiting | None:
    """The run said it paused: watch that it trains no further (counted past its step, on
    its own clock from its ``ts``; a ``RunPaused`` with no step is not watched). Found by
    review: once a run said ``RunPaused`` the controller read none of its steps, so a loop
    that said it paused and trained on (``obey()`` on a side thread) billed while shown
    ``PAUSED_BY_GATE``, and nothing noticed."""
    if paused.step is None:
        return None
    why = f"{paused.reason or 'paused'}"[:300]
    return Waiting(str(paused.event_id), paused.step, paused.step, paused.ts, True, why,
                   held=True)  # fmt: skip


#: ``detector`` (and part of the id) of the page of a pause nobody answers. Never change it.
UNANSWERED = "pause_unanswered"
UNANSWERED_RESPONSE = (
    "The run trains on past a pause request: its training loop does not act on its "
    "commands (no hook.obey(step) at each step's end, follow_commands=False, a hook from "
    "before 2026-11-27, a command reader that cannot read the log (said once in the "
    "run's own log), a multi-process run whose callback is on process zero only). Stop "
    "it with its scheduler or launcher (or have the tenant stop it), then fix the loop: "
    "docs/hooks.md, docs/run-control.md."
)
#: The facts of a trained step this fold reads (the other telemetry it skips at once).
_STEP_FACTS = frozenset({TrainerStepCompleted, StepPhaseTimed})
#: The types this fold acts on besides the step facts.
_INPUTS = frozenset(
    {
        AlertFired,
        AlertResolved,
        PauseRequested,
        UnpauseRequested,
        RunSubmitted,
        RunStarted,
        RunPaused,
        RunResumed,
        RunFailed,
        RunCompleted,
        RunCancelled,
    }
)
#: State fields after the first three when "failed" was told apart from "over".
_FAILED_SINCE = 5
#: State fields after the first three when the end of a run (its step, its clock) was kept.
_ENDED_SINCE = 7
#: The lifecycle facts of a process training a failed run again (a restart).
_RESTARTS = frozenset({RunSubmitted, RunStarted, RunResumed, RunPaused})
#: How many pause requests a run remembers (who asked each).
MAX_ASKED = 16


def _remember(
    asked: tuple[tuple[str, str], ...], request_id: str, by: str
) -> tuple[tuple[str, str], ...]:
    if any(rid == request_id for rid, _ in asked):
        return asked
    return (*asked, (request_id, by))[-MAX_ASKED:]
