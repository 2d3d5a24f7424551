"""The customer-facing run state machine as a pure fold (seed 000 step 5).

States (append-only enum :data:`events.catalog.derived.RunState`): SUBMITTED, QUEUED,
PROVISIONING, RUNNING, DEGRADED(reason), PAUSED_BY_GATE(reason), SUCCEEDED,
FAILED(class), CANCELLED. Lifecycle events move the base state; alerts move RUNNING <->
DEGRADED through :class:`~projections.policy.RunStatePolicy` (with step-counted
hysteresis); PAUSED_BY_GATE follows the trainer's ``RunPaused`` (which the run controller
asked for: ``stream_processors/control``), so the state says what the run is doing, not
what was asked of it; the reward ledger feeds attribution and can gate the run. Every change is one
:class:`~events.RunStateChanged` with a deterministic id
(``derived_id(producer, cause event id, to_state)``) and the cause's ``ts``/``step``.
A transition the table :data:`LEGAL` does not allow is rejected: not applied, kept in
``Machine.rejected`` (operator view, ``runwatch_run_state_transitions_rejected_total``).

Ordering (why the output does not depend on how the input topics interleave):
transition-relevant facts of a run (lifecycle, alerts, checkpoints, pausing ledger
failures) are applied in the *canonical* order ``(ts, rank, event_id)``. One that
arrives after a fact that sorts later (another topic was read first) is inserted into
the run's kept history and the machine is re-folded from scratch; the emitted timeline
is a prefix of the re-folded one whenever that late fact sorts after the last *emitted*
change, so exactly the missing changes are emitted. Ledger totals are commutative. The
one guarantee the fold needs from its host is the *terminal barrier*: alerts and ledger
facts that precede a run's terminal lifecycle event in event time are delivered before
it (the replay merge and the live host's lifecycle hold ensure it). A late fact that
would rewrite an already emitted change is not hidden: the fold emits one correcting
change (counted in ``corrections``); SUCCEEDED and CANCELLED are never corrected
(counted in ``Machine.late_after_terminal``). FAILED is left by a restart (a failed run
trained again: ``runwatch resume``, a requeued hooked job), so a fact read late behind a
failure is re-folded in order like any other: the restart's ``RunResumed`` read after an
alert of the restarted process still reopens the run. SUCCEEDED is left by a process
that trains the run again (a framework's second ``train()``): its lifecycle fact stamped
after the completion reopens it, re-folded in order when read late.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pydantic_core

from events import (
    AlertFired,
    AlertResolved,
    CheckpointWritten,
    RewardBatchFailed,
    RewardBatchScored,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunProvisioning,
    RunQueued,
    RunResumed,
    RunStarted,
    RunStateChanged,
    RunSubmitted,
)
from events.catalog.derived import RunState
from events.codec import decode_or_raise, encode
from events.envelope import EventBase, derive_envelope
from events.identity import HOOK_PRODUCER_PREFIX
from projections.attribution import (
    Attribution,
    Ledger,
    attribute_failure,
    non_convergence,
    tenant_fault,
)
from projections.policy import RunStatePolicy

PRODUCER = "projections/run_state"
#: Policy actions of alerts that pause a run (``pause_at_checkpoint`` is the old name).
PAUSING: frozenset[str] = frozenset({"pause", "pause_at_checkpoint"})
TERMINAL: frozenset[str] = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
#: The terminal states a late fact does not re-fold (FAILED is re-folded: a restart may
#: be read late). No fact leaves CANCELLED; FAILED and SUCCEEDED are left by a process
#: that trains the run again, in order (``LEGAL``).
ABSORBING: frozenset[str] = frozenset({"SUCCEEDED", "CANCELLED"})
ACTIVE: frozenset[str] = frozenset({"RUNNING", "DEGRADED"})
#: from-state -> the states it may move to (``None``: a run never seen before).
LEGAL: dict[str | None, frozenset[str]] = {
    # RUNNING / PAUSED_BY_GATE: a run first seen from a process started from a checkpoint
    # (a hook added to a run already going, TRL's resume_from_checkpoint)
    None: frozenset({"SUBMITTED", "QUEUED", "RUNNING", "PAUSED_BY_GATE", "CANCELLED", "FAILED"}),
    # RUNNING: a run whose platform tells no queueing (a customer's hook, an import)
    "SUBMITTED": frozenset({"QUEUED", "PROVISIONING", "RUNNING", "CANCELLED", "FAILED"}),
    "QUEUED": frozenset({"PROVISIONING", "RUNNING", "CANCELLED", "FAILED"}),
    "PROVISIONING": frozenset({"QUEUED", "RUNNING", "CANCELLED", "FAILED"}),
    "RUNNING": frozenset({"DEGRADED", "PAUSED_BY_GATE", "SUCCEEDED", "FAILED", "CANCELLED"}),
    "DEGRADED": frozenset({"RUNNING", "PAUSED_BY_GATE", "SUCCEEDED", "FAILED", "CANCELLED"}),
    "PAUSED_BY_GATE": frozenset({"RUNNING", "DEGRADED", "SUCCEEDED", "FAILED", "CANCELLED"}),
    # a completed run trained again by its process (a framework's second train(): its
    # RunResumed / RunStarted / RunPaused): the gates act on it, and people must be able
    # to resume or cancel it (found by review: a gate's pause of such a run could be
    # neither resumed nor cancelled, its process held forever)
    "SUCCEEDED": frozenset({"SUBMITTED", "RUNNING", "DEGRADED", "PAUSED_BY_GATE"}),
    # a failed run may be trained again (``runwatch resume``, a requeued hooked job): its
    # restart's RunSubmitted / RunStarted / RunResumed / RunPaused say so (the gates act
    # on it again)
    "FAILED": frozenset({"SUBMITTED", "RUNNING", "PAUSED_BY_GATE"}),
    "CANCELLED": frozenset(),
}
#: Lifecycle facts a restarted process writes that say what the state already is (a
#: requeued job's RunSubmitted/RunStarted or RunResumed while RUNNING, a restart's
#: RunPaused while PAUSED_BY_GATE): taken as they are, no change and no rejection. (Found
#: by review: each was a rejected transition, and every preemption, requeue or
#: ``runwatch resume`` of a killed trainer paged operators about a producer out of order.)
_RESTATING: dict[type, frozenset[str]] = {
    RunSubmitted: frozenset(
        {"SUBMITTED", "QUEUED", "PROVISIONING", "RUNNING", "DEGRADED", "PAUSED_BY_GATE"}
    ),
    RunStarted: ACTIVE,
    RunResumed: ACTIVE,
    RunPaused: frozenset({"PAUSED_BY_GATE"}),
}


#: The facts of a process training a completed run again (``LEGAL["SUCCEEDED"]``).
_REOPENING = (RunSubmitted, RunStarted, RunResumed, RunPaused)


def _reopens(state: Any, event: EventBase) -> bool:
    """Does a late ``event`` reopen a SUCCEEDED run: a process's fact of training it again,
    stamped after its completion? Then it is re-folded like any late fact of a live run
    (found by review: one of that stage's alerts read ahead of its ``RunResumed`` left the
    run SUCCEEDED while it trained, the output depending on how topics interleave)."""
    if state.machine.state != "SUCCEEDED" or not isinstance(event, _REOPENING):
        return False
    ends = [h.ts for h in state.history if isinstance(h, RunCompleted)]
    return bool(ends) and event.ts > ends[-1]


#: Entries of ``Machine.fired`` kept (see :func:`_with_fired`).
MAX_FIRED_KEPT = 256


def _with_fired(
    fired: tuple[tuple[str, str, int, int], ...], new: tuple[str, str, int, int]
) -> tuple[tuple[str, str, int, int], ...]:
    """``fired`` with ``new`` added, at most :data:`MAX_FIRED_KEPT`: past it the oldest
    entry of a detector that has a later one goes, so every detector that ever fired stays
    named (the completion policy's ``fail_if_fired`` and the attribution read them). Found
    by review: one entry per alert episode, without bound, in a state every commit wrote."""
    out = (*fired, new)
    over = len(out) - MAX_FIRED_KEPT
    if over <= 0:
        return out
    last = {entry[0]: i for i, entry in enumerate(out)}
    drop = {i for i, entry in enumerate(out) if last[entry[0]] != i}  # not a detector's last
    drop = set(sorted(drop)[:over])  # the oldest (all at once: an older state shrinks too)
    kept = tuple(entry for i, entry in enumerate(out) if i not in drop)
    return kept[len(kept) - MAX_FIRED_KEPT :] if len(kept) > MAX_FIRED_KEPT else kept


def restates(state: str | None, kind: type) -> bool:
    """Does a ``kind`` fact of a restarted process say what ``state`` already is?"""
    return state in _RESTATING.get(kind, ())


_TARGET: dict[type, str] = {
    RunSubmitted: "SUBMITTED",
    RunQueued: "QUEUED",
    RunProvisioning: "PROVISIONING",
    RunStarted: "RUNNING",
    RunPaused: "PAUSED_BY_GATE",
    RunResumed: "RUNNING",
    RunCompleted: "SUCCEEDED",
    RunFailed: "FAILED",
    RunCancelled: "CANCELLED",
}
#: Canonical tie-break at equal ts: lifecycle progress (in its own order: a hook's
#: ``RunSubmitted`` and ``RunStarted`` share one ``ts``), checkpoints, alerts, ledger, ends.
_RANK: dict[type, int] = {
    RunSubmitted: 0,
    RunQueued: 1,
    RunProvisioning: 2,
    RunStarted: 3,
    RunPaused: 3,
    RunResumed: 3,
    CheckpointWritten: 4,
    AlertFired: 5,
    AlertResolved: 5,
    RewardBatchFailed: 6,
    RunCompleted: 7,
    RunFailed: 7,
    RunCancelled: 7,
}


_DEFAULT_REASON = {
    "SUBMITTED": "submitted",
    "QUEUED": "waiting for capacity",
    "PROVISIONING": "starting machines",
    "RUNNING": "training",
    "CANCELLED": "cancelled",
}


def canonical_key(ev: EventBase) -> tuple[float, int, str]:
    return (ev.ts, _RANK[type(ev)], str(ev.event_id))


@dataclass(frozen=True, slots=True)
class ActiveAlert:
    alert_id: str
    detector: str
    action: str
    reason: str  # customer-facing, from the policy


@dataclass(frozen=True, slots=True)
class Machine:
    state: RunState | None = None
    reason: str = ""
    failure_class: str | None = None
    entered_step: int | None = None
    active: tuple[ActiveAlert, ...] = ()
    #: (detector, reason, window_start, window_end) of every alert fired: health history.
    fired: tuple[tuple[str, str, int, int], ...] = ()
    attribution: Attribution | None = None
    #: (event type, event id, from state, why) of every rejected transition.
    rejected: tuple[tuple[str, str, str, str], ...] = ()
    late_after_terminal: int = 0


@dataclass(frozen=True, slots=True)
class RunStatus:
    """One run's fold state: the machine, the ledger, the kept canonical history of
    transition-relevant facts and the ids of the changes emitted so far."""

    tenant_id: str = ""
    run_id: str = ""
    machine: Machine = field(default_factory=Machine)
    ledger: Ledger = field(default_factory=Ledger)
    history: tuple[EventBase, ...] = ()
    emitted: tuple[str, ...] = ()
    corrections: int = 0


def _step_of(ev: EventBase) -> int | None:
    if isinstance(ev, AlertFired) and ev.step is None:
        return ev.window_end
    return ev.step


class _Stepper:
    """Applies one fact to a machine, collecting the changes it causes."""

    def __init__(self, policy: RunStatePolicy, ledger: Ledger) -> None:
        self.policy, self.ledger, self.out = policy, ledger, []

    def move(self, m: Machine, to: str, reason: str, cause: EventBase, att=None) -> Machine:
        fclass = att.failure_class if att else None
        self.out.append(
            RunStateChanged(
                **derive_envelope(cause, PRODUCER, to),
                from_state=m.state,
                to_state=to,
                reason=reason,
                failure_class=fclass,
                caused_by=f"{cause.type}:{cause.event_id}",
            )
        )
        step = _step_of(cause)
        return replace(
            m,
            state=to,
            reason=reason,
            failure_class=fclass,
            attribution=att or m.attribution,
            entered_step=step if step is not None else m.entered_step,
        )

    def apply(self, m: Machine, ev: EventBase) -> Machine:
        t = type(ev)
        if m.state in TERMINAL and t not in _TARGET:
            return replace(m, late_after_terminal=m.late_after_terminal + 1)
        if t is AlertFired:
            rule = self.policy.rule(ev.detector)
            reason = rule.customer_reason.replace("{reason}", ev.reason)
            if all(a.alert_id != ev.alert_id for a in m.active):
                alert = ActiveAlert(ev.alert_id, ev.detector, rule.action, reason)
                m = replace(m, active=(*m.active, alert))
            m = replace(
                m, fired=_with_fired(m.fired, (ev.detector, ev.reason, ev.window_start,
                                               ev.window_end))
            )  # fmt: skip
            return self.overlay(m, ev)
        if t is AlertResolved:
            m = replace(m, active=tuple(a for a in m.active if a.alert_id != ev.alert_id))
            return self.overlay(m, ev)
        if t is CheckpointWritten:
            return self.overlay(m, ev)
        if t is RewardBatchFailed:
            if m.state in ACTIVE:
                return self.move(
                    m, "PAUSED_BY_GATE", f"reward scoring paused the run: {ev.message}", ev
                )
            return m
        return self.lifecycle(m, ev)

    def lifecycle(self, m: Machine, ev: EventBase) -> Machine:
        to = _TARGET[type(ev)]
        if restates(m.state, type(ev)):  # a restarted process says what is already so
            return m
        if to not in LEGAL[m.state]:
            why = f"{m.state} -> {to} is not a legal transition"
            return replace(
                m, rejected=(*m.rejected, (ev.type, str(ev.event_id), str(m.state), why))
            )
        if isinstance(ev, RunCompleted):
            return self.complete(m, ev)
        if isinstance(ev, RunFailed):
            ledger = self.ledger.as_of(ev.ts)  # not the reward facts from after the failure
            tenant = self._tenant_alerts(m)
            if ev.failure_class is None and tenant:  # an alert the policy books to the tenant
                att = tenant_fault(ledger, tenant[0])
                return self.move(m, "FAILED", att.message, ev, att)
            algorithmic = tuple(a.reason for a in m.active if a.action != "advisory")
            att = attribute_failure(
                ev.failure_class,
                ev.reason,
                ledger,
                self.policy.attribution.tenant_failure_ratio,
                m.fired,
                algorithmic,
                reported_by_tenant=ev.producer.startswith(HOOK_PRODUCER_PREFIX),
            )
            return self.move(m, "FAILED", att.message, ev, att)
        degrading = [a for a in m.active if a.action != "advisory"]
        if isinstance(ev, RunResumed) and degrading:  # resumed into a still-firing alert
            return self.move(m, "DEGRADED", degrading[0].reason, ev)
        reason = getattr(ev, "reason", "") or _DEFAULT_REASON.get(to, "")
        if isinstance(ev, RunPaused):
            reason = self._pause_reason(m, ev, reason)
        m = self.move(m, to, reason, ev)
        return self.overlay(m, ev) if to == "RUNNING" else m

    def _pause_reason(self, m: Machine, ev: RunPaused, said: str) -> str:
        """What the customer reads for a pause: a gate's (the controller's request) in the
        words of the alert it named; a person's, the reward policy's or a restart's as the
        trainer said it. A pause recorded before ``requested_by`` (v2: '' with a request
        id) is taken as a gate's while a pausing alert is open, as it was then. (Found by
        review: every pause while a pausing alert was open read as the first such alert's
        gate — a customer's maintenance pause as "possible reward hacking", a KL page's
        pause as an earlier ticket's.)"""
        gates = [a for a in m.active if a.action in PAUSING]
        if ev.requested_by == "controller":
            named = [a for a in m.active if a.alert_id == ev.alert_id] or gates
            return f"paused: {named[0].reason}" if named else said
        if not ev.requested_by and ev.request_id and gates:  # v2: whose is unknown
            return f"paused: {gates[0].reason}"
        return said

    def _tenant_alerts(self, m: Machine, among: Sequence[str] | None = None) -> list[str]:
        """Reasons of the active alerts (of the detectors ``among``, if given) that the
        policy books to the tenant's code (``failure_class: tenant_code_fault``)."""
        rule = self.policy.rule
        return [
            a.reason
            for a in m.active
            if (among is None or a.detector in among)
            and rule(a.detector).failure_class == "tenant_code_fault"
        ]

    def complete(self, m: Machine, ev: EventBase) -> Machine:
        rule = self.policy.completion
        tenant = self._tenant_alerts(m, rule.fail_if_active)
        if tenant:  # the tenant's reward, not the training: booked to the tenant
            att = tenant_fault(self.ledger.as_of(ev.ts), tenant[0])
            return self.move(m, "FAILED", att.message, ev, att)
        bad = [a.reason for a in m.active if a.detector in rule.fail_if_active]
        bad += [f"{d}: {r}" for d, r, _, _ in m.fired if d in rule.fail_if_fired]
        if bad:
            att = non_convergence(m.fired, tuple(dict.fromkeys(bad)), "completed, judged by policy")
            return self.move(m, "FAILED", att.message, ev, att)
        return self.move(m, "SUCCEEDED", "training completed", ev)

    def overlay(self, m: Machine, cause: EventBase) -> Machine:
        """Alerts over the base state: degrade, recover with dwell. A pausing alert only
        degrades here: the run is PAUSED_BY_GATE once its trainer says ``RunPaused``
        (the run controller asked it to), never because an alert fired."""
        if m.state not in ACTIVE:
            return m
        degrading = [a for a in m.active if a.action != "advisory"]
        if degrading and m.state == "RUNNING":
            return self.move(m, "DEGRADED", degrading[0].reason, cause)
        if not degrading and m.state == "DEGRADED":
            dwell, step = self.policy.min_dwell_steps, _step_of(cause)
            if dwell <= 0 or (step is not None and step - (m.entered_step or 0) >= dwell):
                return self.move(m, "RUNNING", "all alerts resolved", cause)
        return m


class RunStateFold:
    """:class:`events.fold.Fold` of the run state machine, keyed by ``run_id``."""

    name = "run_state"
    inputs = ("runwatch.lifecycle", "runwatch.alerts", "runwatch.rewards", "runwatch.checkpoints")

    def __init__(self, policy: RunStatePolicy | None = None) -> None:
        self.policy = policy or RunStatePolicy.load()

    def initial(self) -> RunStatus:
        return RunStatus()

    def key_of(self, event: EventBase) -> str:
        return event.run_id

    def apply(self, state: RunStatus, event: EventBase) -> tuple[RunStatus, Sequence[EventBase]]:
        t = type(event)
        if not state.run_id:
            state = replace(state, tenant_id=event.tenant_id, run_id=event.run_id)
        if t is RewardBatchScored or t is RewardBatchFailed:
            ledger = state.ledger.add(event, self.policy.attribution.max_examples)
            state = RunStatus(
                state.tenant_id,
                state.run_id,
                state.machine,
                ledger,
                state.history,
                state.emitted,
                state.corrections,
            )
            gating = t is RewardBatchFailed and event.action == "pause"
            if not (gating and self.policy.ledger.pause_on_action_pause):
                return state, ()
        elif t not in _RANK:
            return state, ()
        key = canonical_key(event)
        if not state.history or key > canonical_key(state.history[-1]):
            step = _Stepper(self.policy, state.ledger)
            m = step.apply(state.machine, event)
            ids = tuple(str(e.event_id) for e in step.out)
            return replace(
                state, machine=m, history=(*state.history, event), emitted=state.emitted + ids
            ), step.out
        return self._late(state, event)

    def _late(self, state: RunStatus, event: EventBase) -> tuple[RunStatus, list[EventBase]]:
        if any(h.event_id == event.event_id for h in state.history):
            return state, []  # a duplicate the host did not catch
        if state.machine.state in ABSORBING and not _reopens(state, event):
            # (FAILED re-folds: a restart may be late)
            m = replace(state.machine, late_after_terminal=state.machine.late_after_terminal + 1)
            return replace(state, machine=m), []
        history = tuple(sorted((*state.history, event), key=canonical_key))
        step = _Stepper(self.policy, state.ledger)
        m = Machine()
        for fact in history:
            m = step.apply(m, fact)
        ids = tuple(str(e.event_id) for e in step.out)
        n = len(state.emitted)
        if ids[:n] == state.emitted:
            return replace(state, machine=m, history=history, emitted=ids), step.out[n:]
        out: list[EventBase] = []
        if m.state != state.machine.state:  # history was told differently: say so, once
            fix = _Stepper(self.policy, state.ledger)
            fix.move(
                state.machine,
                m.state,
                f"corrected after a late fact: {m.reason}",
                event,
                m.attribution,
            )
            out = fix.out
        emitted = state.emitted + tuple(str(e.event_id) for e in out)
        return replace(
            state, machine=m, history=history, emitted=emitted, corrections=state.corrections + 1
        ), out

    def dump_state(self, state: RunStatus) -> bytes:
        """JSON; built field by field (tuples of scalars serialize as they are), so the
        kept events are encoded once by the codec rather than deep-copied by ``asdict``.
        Written at every checkpoint for every run that changed, and the reward ledger's
        recent facts make it ~20 kB: serialized by pydantic-core, NaN as ``NaN``."""
        m = state.machine
        machine = {
            "state": m.state,
            "reason": m.reason,
            "failure_class": m.failure_class,
            "entered_step": m.entered_step,
            "active": [asdict(a) for a in m.active],
            "fired": m.fired,
            "rejected": m.rejected,
            "late_after_terminal": m.late_after_terminal,
            "attribution": asdict(m.attribution) if m.attribution else None,
        }
        led = state.ledger
        doc = {
            "tenant_id": state.tenant_id,
            "run_id": state.run_id,
            "machine": machine,
            "ledger": {f: getattr(led, f) for f in led.__dataclass_fields__},
            "history": [encode(e).decode() for e in state.history],
            "emitted": state.emitted,
            "corrections": state.corrections,
        }
        return pydantic_core.to_json(doc, inf_nan_mode="constants")  # 5x json.dumps

    def load_state(self, raw: bytes) -> RunStatus:
        return status_from_doc(json.loads(raw))


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def status_from_doc(doc: dict[str, Any]) -> RunStatus:
    m = doc["machine"]
    att = m["attribution"]
    machine = Machine(
        state=m["state"],
        reason=m["reason"],
        failure_class=m["failure_class"],
        entered_step=m["entered_step"],
        active=tuple(ActiveAlert(**a) for a in m["active"]),
        fired=_tuples(m["fired"]),
        rejected=_tuples(m["rejected"]),
        attribution=Attribution(**{k: _tuples(v) for k, v in att.items()}) if att else None,
        late_after_terminal=m["late_after_terminal"],
    )
    ledger = Ledger(**{k: _tuples(v) for k, v in doc["ledger"].items()})
    history = tuple(decode_or_raise(h.encode()) for h in doc["history"])
    return RunStatus(
        doc["tenant_id"],
        doc["run_id"],
        machine,
        ledger,
        history,
        tuple(doc["emitted"]),
        doc["corrections"],
    )
