"""RunControllerFold: a paging alert becomes a ``PauseRequested`` (pure fold, per run).

Inputs: ``runwatch.alerts`` (``AlertFired``), ``runwatch.lifecycle`` (the algorithm from
``RunSubmitted``; whether the run is paused or over, from the trainer's own answers) and
``runwatch.control`` (requests already made, by anyone). Key: ``run_id``. Output:
``PauseRequested(actor="controller")`` on ``runwatch.control``, with a deterministic id
(``derived_id(producer, alert event id, "pause")``), the alert's ``ts`` and ``step``, the
alert id and the policy version.

Rules:

- An ``AlertFired`` pauses when :meth:`ControlPolicy.pauses` says so for the run's tenant,
  algorithm, detector and routing (``page`` by default: ``ticket`` and ``advisory`` never
  pause), the run is live (not already pausing, paused or over), and this alert episode
  (``alert_id``) has not paused the run before — a run a person resumed while the same
  alert is still active is not paused again by it; a new episode pauses again.
- A pausing alert that fires while the run is pausing or paused:

  - under the controller's own pause (a gate's), it is the gate's business: the run is
    stopped, and whoever resumes it answers the gate with every open alert in view (the
    API and the dashboard show them), so the resume covers it;
  - under a person's pause (maintenance, a question), it is *owed*: nobody resuming that
    pause was answering it, so when the run is live again (``RunResumed``, or an unpause
    before the trainer paused) the controller asks for a pause for the owed alerts still
    open (one request, naming them; derived from the event that made the run live). An
    owed alert that resolves first is not owed any more. (Before 2026-11-27 such an alert
    was dropped: a maintenance pause and resume let the run train on past a page.)
- A pause request by anyone makes the run "pausing" until the trainer answers
  ``RunPaused``; ``RunResumed`` makes it live again; ``RunCompleted``, ``RunFailed`` and
  ``RunCancelled`` end it (later alerts do nothing).

The fold does not judge people's commands (the API does, against the projected state, and
the trainer ignores what does not apply to it); it only avoids asking twice. Time: event
fields only. State: one small NamedTuple per run.
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
    RunSubmitted,
)
from events.envelope import EventBase, derive_envelope
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


class ControlState(NamedTuple):
    algorithm: str = "default"
    phase: str = "live"  # live | pausing | paused | over
    acted: tuple[str, ...] = ()  # alert ids this controller paused the run for
    #: who asked for the pause in effect: "controller" (a gate) or "person"
    paused_by: str = ""
    #: pausing alerts that fired under a person's pause, oldest first
    owed: tuple[Owed, ...] = ()


class RunControllerFold:
    """Implements :class:`events.fold.Fold` for run control."""

    name = "run-controller"
    inputs: tuple[str, ...] = ("runwatch.lifecycle", "runwatch.alerts", "runwatch.control")

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
        if t is AlertFired:
            return self._alert(state, event)  # type: ignore[arg-type]
        if state.phase == "over":
            return state, ()
        if t is AlertResolved and state.owed:  # an owed episode that ended is not owed
            gone = event.alert_id  # type: ignore[attr-defined]
            return state._replace(owed=tuple(o for o in state.owed if o.alert_id != gone)), ()
        if t is RunSubmitted:
            return state._replace(algorithm=event.algorithm), ()  # type: ignore[attr-defined]
        if t is PauseRequested and state.phase == "live":
            by = "controller" if event.actor == "controller" else "person"  # type: ignore[attr-defined]
            return state._replace(phase="pausing", paused_by=by), ()
        if t is RunPaused:
            # a pause nobody asked for here (the reward's failure policy) is nobody's gate
            return state._replace(phase="paused", paused_by=state.paused_by or "person"), ()
        if t is RunResumed or (t is UnpauseRequested and state.phase == "pausing"):
            return self._live(state._replace(phase="live", paused_by=""), event)
        if t in (RunCompleted, RunFailed, RunCancelled):
            return state._replace(phase="over", owed=()), ()
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
        return state._replace(phase="pausing", paused_by="controller", acted=acted, owed=()), (
            request,
        )

    def _alert(
        self, state: ControlState, ev: AlertFired
    ) -> tuple[ControlState, Sequence[EventBase]]:
        if state.phase == "over" or ev.alert_id in state.acted:
            return state, ()
        if not self.policy.pauses(
            tenant=ev.tenant_id, algorithm=state.algorithm, detector=ev.detector, routing=ev.routing
        ):
            return state, ()
        if state.phase != "live":  # pausing or paused: the gate's own, or owed (docstring)
            known = any(o.alert_id == ev.alert_id for o in state.owed)
            if state.paused_by == "controller" or known:
                return state, ()
            owed = Owed(ev.alert_id, ev.detector, ev.routing, ev.reason)
            return state._replace(owed=(*state.owed, owed)[-MAX_ACTED:]), ()
        request = PauseRequested(
            **derive_envelope(ev, PRODUCER, "pause"),
            actor="controller",
            principal=PRODUCER,
            reason=f"{ev.detector} ({ev.routing}): {ev.reason}",
            alert_id=ev.alert_id,
            policy_version=self.policy.version,
        )
        acted = (*state.acted, ev.alert_id)[-MAX_ACTED:]
        return state._replace(phase="pausing", paused_by="controller", acted=acted), (request,)

    def dump_state(self, state: ControlState) -> bytes:
        owed = [list(o) for o in state.owed]
        return json.dumps(
            [state.algorithm, state.phase, list(state.acted), state.paused_by, owed]
        ).encode()

    def load_state(self, raw: bytes) -> ControlState:
        """A state stored before owed alerts (three fields) loads with none owed and the
        pause in effect taken as a gate's (what it was treated as then)."""
        algorithm, phase, acted, *rest = json.loads(raw)
        gate = "controller" if phase in ("pausing", "paused") else ""
        paused_by, owed = rest if rest else (gate, [])
        return ControlState(
            algorithm, phase, tuple(acted), paused_by, tuple(Owed(*o) for o in owed)
        )
