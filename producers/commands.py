"""The other half of the emitter SDK: a run follows the commands addressed to it.

A producer that can be told to stop (the trainer) reads ``runwatch.control`` through a
:class:`CommandFeed`: :meth:`CommandFeed.poll` returns the run's ``PauseRequested`` /
``UnpauseRequested`` / ``CancelRequested`` appended since the last poll, in log order,
each once, skipping those already answered (a restarted trainer passes the request ids
its ``RunPaused`` / ``RunResumed`` / ``RunCancelled`` events named, and the last of them:
a pause or unpause before that one on the topic was answered, or passed over by the
process that read it, and is not acted on by the restart either). Records that do not
decode, and commands for other runs (or naming another tenant than the run's), are
skipped: the feed never raises on bad input (the processors' hosts dead-letter them).

The feed reads the same log the emitter writes: the embedded log (read through the
sink's own open log, so a command appended by any process is seen at the next poll), or
any :class:`~events.log.base.LogBackend` behind a :class:`~producers.sinks.BackendSink`
(Kafka: every partition of the control topic, from the positions this feed reached), or
a :class:`~producers.sinks.MemorySink` in tests. Polling is cheap (a stat and a read of
what is new) and the caller decides when: the trainer polls once per step and, while
paused, every ``poll_interval_s``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from events.catalog.control import (
    CONTROL_TOPIC,
    CancelRequested,
    CommandRejected,
    PauseRequested,
    UnpauseRequested,
)
from events.catalog.lifecycle import (
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunResumed,
    RunStarted,
    RunSubmitted,
)
from events.codec import decode
from events.envelope import EventBase
from events.log.base import Record
from events.pauses import pause_in_effect
from producers.emitter import Emitter
from producers.sinks import BackendSink, EmbeddedSink, EventSink, MemorySink

Command = Union[PauseRequested, UnpauseRequested, CancelRequested]  # noqa: UP007
COMMANDS = (PauseRequested, UnpauseRequested, CancelRequested)


class CommandFeed:
    """The commands of one run, as the run's own process follows them."""

    def __init__(
        self,
        sink: EventSink,
        run_id: str,
        *,
        answered: Iterable[str] = (),
        tenant_id: str | None = None,
        superseded: str | None = None,
    ) -> None:
        """``tenant_id``: the run's tenant; a command for this run id that names another
        tenant is skipped (only the run's own tenant, or an operator acting in its name,
        commands it; the processors refuse another tenant's events on a run id).

        ``superseded`` (a restarted process: :func:`last_answered`): the request the
        run's last pause or resume answered. The first poll drops the pauses and unpauses
        before it on the topic: the process that read them answered them or passed them
        over (a resume of a running run, a pause of a paused one) — found by review, a
        second click on Resume, passed over while the run trained, was replayed by the
        restart of a run a gate had paused since, and lifted the gate's pause. A cancel
        is never passed over: one not answered is still due; nor is a person's pause read
        while the run was paused (:func:`held_over`): the process holds the run again for
        it after the resume, and one that died between the resume and that pause left it
        unanswered (found by review: the restart dropped it, and an operator's hold was
        lost)."""
        self.sink = sink
        self.run_id = run_id
        self.tenant_id = tenant_id
        self._seen: set[str] = set(answered)
        self._superseded = superseded
        self._key = run_id.encode()  # commands are keyed by their run: others not decoded
        self._next: dict[int, int] = {}  # partition -> next offset to read
        self._memory_pos = 0

    def poll(self) -> list[Command]:
        """New commands for this run since the last poll (never raises on bad records)."""
        out: list[Command] = []
        key = self._key
        for rec in self._new_records():
            if isinstance(rec, Record) and rec.key is not None and rec.key != key:
                continue  # another run's (a shared log holds every tenant's commands)
            ev = decode(rec.value) if isinstance(rec, Record) else rec
            if not isinstance(ev, COMMANDS) or ev.run_id != self.run_id:
                continue
            if self.tenant_id is not None and ev.tenant_id != self.tenant_id:
                continue
            eid = str(ev.event_id)
            if eid == self._superseded:  # what came before it was answered or passed over
                out = [c for c in out if isinstance(c, CancelRequested) or held_over(c)]
            if eid in self._seen:
                continue
            self._seen.add(eid)
            out.append(ev)
        self._superseded = None  # the first poll read everything up to the restart
        return out

    def _new_records(self) -> list[object]:
        sink = self.sink
        if isinstance(sink, MemorySink):
            new = sink.events[self._memory_pos :]
            self._memory_pos = len(sink.events)
            return list(new)
        if isinstance(sink, EmbeddedSink):
            start = self._next.get(0, 0)
            records = list(sink.log.read_sync(CONTROL_TOPIC, start))
            if records:
                self._next[0] = records[-1].offset + 1
            return records
        if isinstance(sink, BackendSink):
            return sink._call(self._read_backend(sink))
        raise TypeError(f"no command feed over {type(sink).__name__}")

    async def _read_backend(self, sink: BackendSink) -> list[Record]:
        return await read_to_end(sink.backend, CONTROL_TOPIC, self._next)


async def read_to_end(backend: Any, topic: str, positions: dict[int, int]) -> list[Record]:
    """Every record of ``topic`` from ``positions`` (partition -> next offset; 0 when
    absent) to each partition's current end; ``positions`` moves past what was read, only
    when all of it was (a failed read raises and leaves them: the next call reads it all
    again — found by review, a pause read from one partition was lost when a later one's
    read failed, e.g. a gateway's 429)."""
    out: list[Record] = []
    moved = dict(positions)  # committed only once every partition was read: a read that
    for partition in await backend.partitions(topic):  # fails loses nothing read before it
        start = moved.get(partition, 0)
        if await backend.end_offset(topic, partition) <= start:
            continue
        async for rec in backend.read(topic, partition, start, until_end=True):
            out.append(rec)
            moved[partition] = rec.offset + 1
    positions.update(moved)
    return out


# -- what a run's process needs to follow its commands (the trainer and the hooks) -------


def first_cancel(commands: Iterable[object]) -> CancelRequested | None:
    """The cancel among the commands due, if any: it wins over whatever came with it or
    before it was acted on (a pause and a cancel cancel; a resume and a cancel cancel)."""
    return next((c for c in commands if isinstance(c, CancelRequested)), None)


def held_over(command: object) -> bool:
    """Is ``command``, read while the run is paused, a pause to act on once that pause is
    resumed? A person's pause is (accepted while a gate's pause was in flight or on a
    lagging view, it asks to hold the run; found by review: the resume of the gate's
    pause lifted an operator's hold too); the controller's is not (it keeps the alerts of
    a request the run passed over owed, :mod:`stream_processors.control`)."""
    return isinstance(command, PauseRequested) and command.actor != "controller"


def answered_requests(facts: Iterable[EventBase]) -> set[str]:
    """The requests a run's lifecycle facts answered (``RunPaused`` / ``RunResumed`` /
    ``RunCancelled`` name them): a restarted process does not act on them again."""
    answers = (RunPaused, RunResumed, RunCancelled)
    return {e.request_id for e in facts if isinstance(e, answers) and e.request_id}


def last_answered(facts: Iterable[EventBase]) -> str | None:
    """The request the run's last ``RunPaused`` / ``RunResumed`` answered, if any (what a
    restarted process's :class:`CommandFeed` takes as ``superseded``)."""
    last = None
    for e in facts:
        if isinstance(e, RunPaused | RunResumed) and e.request_id:
            last = e.request_id
    return last


def paused_reason(facts: Iterable[EventBase]) -> str | None:
    """The reason of a run's pause if it was paused when its last process stopped: its last
    ``RunPaused`` with no resume answering a request and no completion or cancel after it.
    A restart is not a resume: a ``RunResumed`` that answers no request (a restart's own)
    and a ``RunFailed`` (a process that died paused) end no pause."""
    reason = None
    for e in facts:
        if isinstance(e, RunPaused):
            reason = e.reason
        elif isinstance(e, RunCompleted | RunCancelled) or (
            isinstance(e, RunResumed) and e.request_id
        ):
            reason = None
    return reason


def stale_resume(command: object, pause_id: str | None) -> str:
    """Why a resume must not lift the pause ``pause_id`` ('' when it may): it names
    another pause (``answers``), so it was judged on a view from before this pause (a
    lagging read model: the pause it saw was lifted and the run paused again since). A
    resume naming no pause, or a pause that is not known, is taken as before."""
    answers = getattr(command, "answers", "")
    if not isinstance(command, UnpauseRequested) or not answers or not pause_id:
        return ""
    if answers == pause_id:
        return ""
    return (
        f"resume answers pause {answers}, but the run is paused by {pause_id} "
        "(paused again since): look again"
    )


def _answers(facts: Iterable[EventBase]) -> str:
    pause = pause_in_effect(facts)
    return pause.answered_by if pause is not None else ""


Action = str  # "pause" | "resume" | "cancel"
ACTIONS: dict[str, type[EventBase]] = {
    "pause": PauseRequested,
    "resume": UnpauseRequested,
    "cancel": CancelRequested,
}


def run_phase(facts: Iterable[EventBase]) -> str:
    """Where a run stands for commands, from its lifecycle facts in log order:
    ``unknown`` (never submitted), ``live``, ``paused`` or ``over``. A failed run is over
    until a process trains it again (``runwatch resume``, a requeued hooked job): its
    restart's ``RunStarted``/``RunResumed``/``RunPaused`` make it live (or paused) again,
    so a person can pause or cancel it. So does a completed run's process that trains it
    again (a framework's second ``train()``: its ``RunStarted``/``RunResumed``/
    ``RunPaused``; found by review: a gate paused such a run and nobody could resume or
    cancel it, its process held forever). A cancelled run stays over."""
    phase, reopens = "unknown", False
    for ev in facts:
        if reopens and isinstance(ev, RunSubmitted | RunStarted | RunResumed | RunPaused):
            phase, reopens = "live", False  # restarted after its failure or completion
        if isinstance(ev, RunSubmitted | RunStarted):
            phase = "live" if phase in ("unknown", "live") else phase
        elif isinstance(ev, RunPaused):
            phase = "paused" if phase != "over" else phase
        elif isinstance(ev, RunResumed):
            phase = "live" if phase != "over" else phase
        elif isinstance(ev, RunFailed):
            reopens = reopens or phase != "over"
            phase = "over"
        elif isinstance(ev, RunCompleted):
            phase, reopens = "over", True  # (a later training reopens it, as a failure's)
        elif isinstance(ev, RunCancelled):
            phase, reopens = "over", False
    return phase


#: Settings a resume may change (the trainer's ``RESUME_OVERRIDES``), with their checks.
RESUME_OVERRIDES: dict[str, tuple[str, float, float]] = {
    "lr": ("a learning rate, 0 < lr < 10", 0.0, 10.0),
    "kl_coef": ("a KL penalty weight, 0 <= kl_coef < 100", -1e-12, 100.0),
    "rollback_to_step": ("a step >= 0 (an integer)", -1, 2**53),
}


def bad_overrides(overrides: dict[str, object]) -> str:
    """Why these resume overrides are refused ('' when they are fine)."""
    for key, value in overrides.items():
        if key not in RESUME_OVERRIDES:
            return f"cannot change {key!r} on resume (allowed: {', '.join(RESUME_OVERRIDES)})"
        what, lo, hi = RESUME_OVERRIDES[key]
        kind = int if key == "rollback_to_step" else int | float
        if not (isinstance(value, kind) and not isinstance(value, bool) and lo < value < hi):
            return f"{key} must be {what}, not {value!r}"
    return ""


def refusal(action: Action, phase: str, overrides: dict[str, object] | None = None) -> str:
    """Why ``action`` cannot apply to a run in ``phase`` ('' when it can)."""
    if action not in ACTIONS:
        return f"unknown action {action!r} (pause, resume or cancel)"
    if overrides and action != "resume":
        return "only a resume takes settings to change"
    if overrides and (why := bad_overrides(overrides)):
        return why
    if phase == "unknown":
        return "no such run"
    if phase == "over":
        return "the run has already ended"
    if action == "resume" and phase != "paused":
        return "the run is not paused"
    if action == "pause" and phase == "paused":
        return "the run is already paused"
    return ""


@dataclass(frozen=True)
class Issued:
    """What became of a command: written (``refused`` empty) or refused with the reason
    (then a ``CommandRejected`` naming it was written instead)."""

    command: EventBase
    refused: str = ""
    tenant_id: str = ""


#: Customer-facing run states (events.catalog.derived.RunState) -> command phase.
_PHASE_OF_STATE = {
    "PAUSED_BY_GATE": "paused",
    "SUCCEEDED": "over",
    "FAILED": "over",
    "CANCELLED": "over",
}


def phase_of_state(state: str | None) -> str:
    """The command phase of a projected run state (``None``: never seen -> unknown)."""
    if state is None:
        return "unknown"
    return _PHASE_OF_STATE.get(state, "live")


def write_command(
    sink: EventSink,
    *,
    run_id: str,
    tenant_id: str,
    action: Action,
    phase: str,
    actor: str,
    principal: str,
    reason: str = "",
    overrides: dict[str, object] | None = None,
    answers: str = "",
) -> Issued:
    """Judge one command against the run's ``phase`` and write it, or write its
    ``CommandRejected`` (never a state change). Returns what became of it. ``answers``
    (a resume): the pause the requester saw (:attr:`events.pauses.Pause.answered_by`;
    '' for none)."""
    cls = ACTIONS.get(action)
    if cls is None:
        raise ValueError(f"unknown action {action!r} (pause, resume or cancel)")
    emitter = Emitter(
        sink, tenant_id=tenant_id, run_id=run_id, producer=f"{actor}/{principal}",
        first_seq=time.time_ns(),
    )  # fmt: skip
    extra: dict[str, object] = {"overrides": overrides} if overrides and action == "resume" else {}
    if answers and action == "resume":
        extra["answers"] = answers
    command = emitter.emit(cls, actor=actor, principal=principal, reason=reason, **extra)
    why = refusal(action, phase, overrides)
    if why:
        emitter._pending.clear()
        emitter.emit(
            CommandRejected, command_id=str(command.event_id), command=cls.__name__, reason=why
        )
    emitter.flush()
    return Issued(command, why, tenant_id)


def issue(
    log_dir: str | os.PathLike[str],
    run_id: str,
    action: Action,
    *,
    actor: str,
    principal: str,
    reason: str = "",
    overrides: dict[str, object] | None = None,
    tenant_id: str | None = None,
) -> Issued:
    """Judge and append one command to an embedded log's control topic, judged by the
    run's lifecycle facts on that log.

    The lifecycle is read read-only (never repairing anything); the command is appended
    under the control topic's writer lock, so the API, the CLI and the run controller may
    write at once. ``tenant_id``, when given, must own the run: another tenant's run is
    refused as "no such run" (the API answers 404 for both).
    """
    from events.log.embedded import EmbeddedLog

    root = Path(log_dir)
    facts: list[EventBase] = []
    if root.is_dir():
        reader = EmbeddedLog(root, readonly=True)
        reader.open_sync()
        topics = [t for t in ("runwatch.lifecycle",) if t in reader.topic_names()]
        facts = [
            e for e in reader.iter_events(topics) if isinstance(e, EventBase) and e.run_id == run_id
        ]
    owner = facts[0].tenant_id if facts else (tenant_id or "")
    # a run id is its first tenant's: another tenant's facts on it (a forged RunFailed)
    # must not decide the run's phase
    facts = [f for f in facts if f.tenant_id == owner]
    foreign = tenant_id is not None and owner != tenant_id
    return write_command(
        EmbeddedSink(EmbeddedLog(root)),  # appends to the control topic only
        run_id=run_id,
        tenant_id=tenant_id if foreign and tenant_id is not None else owner,
        action=action,
        phase="unknown" if foreign else run_phase(facts),
        actor=actor,
        principal=principal,
        reason=reason,
        overrides=overrides,
        answers=_answers(facts) if action == "resume" and not foreign else "",
    )
