"""A hooked run obeys its commands: the gates act on a customer's own framework too.

The run controller turns a paging alert into a ``PauseRequested`` on ``runwatch.control``;
customers and operators write ``UnpauseRequested`` / ``CancelRequested`` there. runwatch's
own trainer follows them (``trainer.loop.Trainer.follow_commands``); a TRL or verl run
follows them through its hook: :meth:`CommandFollower.obey`, called by the framework
adapter on the training thread at every step boundary, after the step was reported.

- A reader thread of the follower's own reads the commands every ``poll_s`` (0.5 s);
  ``obey`` only takes what it found (no I/O on the training thread, whatever the target
  does: a broker outage costs a step boundary nothing), so a pause lands within a step
  plus ``poll_s``.
- **Pause**: ``RunPaused`` is published (and flushed) and ``obey`` blocks, looking for
  commands every ``poll_s``, until an unpause (``RunResumed``; the time paused is no
  step's time, so it is never billed) or a cancel. The framework's own state stays in
  memory; nothing is generated or trained meanwhile, so the run's spend stays flat.
  A hooked trainer takes no settings from a resume (``overrides``: said in
  ``RunResumed``'s reason, not applied).
- **Cancel**: ``RunCancelled`` is published (the run's last lifecycle fact: the hook's
  ``finish`` then publishes nothing) and ``obey`` answers True; the adapter stops training
  (TRL: ``control.should_training_stop``; verl: :class:`RunCancelledByRunwatch` raised
  out of its logger).
- **A restart is not a resume** (as the trainer): a process started while its run is
  paused (its last ``RunPaused`` has no answered resume or end after it; a scheduler
  requeued a job killed while it waited) publishes ``RunPaused`` again at its first look
  (TRL: ``on_train_begin``, before a step; verl: when its logger is made) and waits. The
  hook's start and its first look wait up to ``RESTART_WAIT_S`` for the reader's first
  answer, to publish no ``RunResumed`` of its own and train no step for a run still
  paused (found by review: they waited 0.2 s, then the restart said RUNNING and trained
  3 steps on a log of 20,000 other runs' facts, 17 on 60,000, before ``RunPaused``); the
  first read decodes only the run's own records (the lifecycle and control topics are
  keyed by run). Every process's first look waits so, said restart or not: a process
  started without ``resumed_from`` may be a restart too (verl's logger on every start, a
  TRL job requeued before its first checkpoint, a plain loop), and one that waited 0.2 s
  trained 14 steps under a gate's pause and billed them (review, 2026-11-28, third
  round); a fresh run's first answer comes in the time its first read takes (the start's
  ``RunSubmitted``/``RunStarted`` of a process that is no said restart wait for nothing).
- A person's pause that comes while the run is paused (accepted while a gate's pause was
  in flight, or on a lagging view) is kept: when the pause in effect is resumed, the run
  pauses again for it (review, 2026-11-28, third round: an operator's hold was lifted by
  the customer's resume of the gate's pause). The controller's are not (it keeps its own
  alerts owed).
- Commands that come together are acted on in order, a cancel first (as the trainer). A
  command this run answered before (a restarted process: its ``RunPaused`` /
  ``RunResumed`` / ``RunCancelled`` name the request) is not acted on again; one written
  while no process followed (a cancel sent while it was down) is acted on at the first
  step boundary.
- The reader reads the hook's target: the embedded log (read-only), Kafka or the ingest
  gateway (a client of its own; no call waits more than ``KAFKA_WAIT_S``). A reader that
  cannot be made or read is said once in the log and taken as no command (made again
  after ``RETRY_S``, 2 s: it was 30 s, so a hook whose log came back read no command for
  up to 30 s): training never fails on it, but a reader that cannot read for
  ``pause_when_unmonitored_s`` holds the run (below: a hook whose credentials may write
  but not read ``runwatch.control`` is held after 300 s, loudly, until it can read or the
  guard is turned off). Only the run's own tenant's commands count.
  The reader keeps when it last read (:attr:`CommandFollower.read_ok_at`) and since when
  it cannot (:attr:`CommandFollower.unread_since`, the start of the first failed read
  after a good one), ``time.monotonic()``: a hook's ``pause_when_unmonitored_s`` holds
  the run when that lasts (:mod:`producers.hooks.unmonitored`); ``on_reachable`` is
  called when a read succeeds after a failure (the hook ships its spool at once).
- A process started for a run cancelled before stops at its first look (nothing more is
  published).

Assumption: one process follows the commands (a TRL run's process zero, verl's single
driver). In a multi-process TRL run the other ranks take process zero's verdict at each
step boundary (:mod:`producers.hooks.ranks`: a broadcast, with a keepalive while paused,
``waiting``), so the whole world pauses and stops together.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from queue import Empty, Queue
from typing import Any

from events.catalog.control import CommandRejected, PauseRequested, UnpauseRequested
from events.catalog.lifecycle import (
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunResumed,
    RunStarted,
    RunSubmitted,
)
from events.envelope import EventBase
from events.pauses import pause_in_effect
from producers.commands import (
    CommandFeed,
    answered_requests,
    first_cancel,
    held_over,
    last_answered,
    paused_reason,
    read_to_end,
    stale_resume,
)

log = logging.getLogger("runwatch.hooks")

LIFECYCLE = "runwatch.lifecycle"
#: seconds before a reader that could not be made is tried again (short: a hook held
#: because runwatch was unreachable is released only once its commands are read again)
RETRY_S = 2.0
#: the longest one Kafka call of the reader may take
KAFKA_WAIT_S = 5.0
#: the longest the reader's first read may take (the run's lifecycle and every command
#: so far, on a log that may hold every tenant's: it runs on the reader's own thread)
OPEN_WAIT_S = 300.0
#: the longest a restarted process (its run may be paused by a gate) waits for the
#: reader's first answer, at its start and before its first step: a restart trains no
#: step and says no ``RunResumed`` before it knows (none by then: it trains, and says so)
RESTART_WAIT_S = 30.0
#: how the ``RunPaused`` of a process started while its run was paused begins
STILL_PAUSED = "still paused when its training process started: "
#: ``publish(event class, step, **payload)``: the hook's way to publish a lifecycle fact
Publish = Callable[..., None]
#: The most characters of one piece of text a hook sends (a reason, a checkpoint path, a
#: config value: :func:`cut_text`): the ingest gateway refuses a record with any longer
#: than twice this (``runwatch.apps.ingest_policy.MAX_TEXT_CHARS``), and the read models
#: keep a run's lifecycle facts, text and all.
MAX_TEXT_CHARS = 2_000
#: The most characters of a name a hook sends (a phase, an eval split, a worker, an
#: algorithm: ``ingest_policy.NAME_FIELDS``, as long as a run id may be).
MAX_NAME_CHARS = 256
NAME_FIELDS = frozenset({"phase", "split", "worker", "algorithm"})


def cut_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text``, or its head and how long it was when it is over ``limit`` characters
    (the result is at most ``limit``, so a cut text is never cut again differently)."""
    if len(text) <= limit:
        return text
    tail = f"... ({len(text)} characters, cut)"
    return text[: max(limit - len(tail), 0)] + tail[:limit]


def cut_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` (an event's fields) with every string cut (:func:`cut_text`): names at
    :data:`MAX_NAME_CHARS`, other text at :data:`MAX_TEXT_CHARS`, and the keys and string
    values of a mapping (a config, sentinels) too; ``extra`` (a step's other metrics, not
    judged by the gateway) as it is. A fact with a long text is sent, cut, rather than
    refused: a ``RunFailed`` whose traceback is long still ends its run."""
    out: dict[str, Any] = {}
    for name, value in payload.items():
        limit = MAX_NAME_CHARS if name in NAME_FIELDS else MAX_TEXT_CHARS
        if isinstance(value, str):
            value = cut_text(value, limit)
        elif isinstance(value, Mapping) and name != "extra":
            value = {
                cut_text(str(k), limit): cut_text(v, limit) if isinstance(v, str) else v
                for k, v in value.items()
            }
        out[name] = value
    return out


class RunCancelledByRunwatch(Exception):
    """Raised out of a framework's logger (verl) when the run was cancelled: stop training."""


class CommandFollower:
    """The commands of one hooked run, acted on at step boundaries (module docstring)."""

    def __init__(
        self,
        run_id: str,
        tenant_id: str,
        *,
        kafka: str | None,
        log_dir: Path,
        publish: Publish,
        backend: Callable[[], Any] | None = None,
        flush: Callable[[], Any],
        poll_s: float = 0.5,
        producer: str = "",
        on_reachable: Callable[[], Any] | None = None,
    ) -> None:
        """``producer``: the hook's own producer name (its facts are this process's).
        ``backend``: makes the log to read when it is neither Kafka nor the embedded log
        (the ingest gateway's :class:`~producers.hooks.gateway.GatewayLog`).
        ``on_reachable``: called (on the reader thread) when a read succeeds after one
        failed."""
        self.on_reachable = on_reachable
        #: monotonic start of the last read that succeeded (None: none yet)
        self.read_ok_at: float | None = None
        #: monotonic start of the first failed read since the last good one (None: reading)
        self.unread_since: float | None = None
        self.producer = producer
        self.backend = backend
        self.run_id = run_id
        self.tenant_id = tenant_id
        self.kafka = kafka
        self.log_dir = log_dir
        #: every fact published with its text cut (:func:`cut_payload`: a command's
        #: reason, an actor, a checkpoint path can be long)
        self.publish: Publish = lambda cls, step, **kw: publish(cls, step, **cut_payload(kw))
        self.flush = flush
        self.poll_s = poll_s
        self.cancelled = False
        #: seconds spent paused so far (the adapter's step timing leaves them out)
        self.paused_s = 0.0
        self._feed: CommandFeed | None = None
        self._sink: Any = None
        self._said: set[str] = set()
        #: the reason of the run's pause when this process started (read at the first look)
        self.still_paused: str | None = None
        #: the id of that pause (:func:`~producers.commands.pause_in_effect`)
        self.still_paused_id: str | None = None
        self._retry_at = -float("inf")  # no reader before then (the last try failed)
        self._inbox: Queue[Any] = Queue()  # commands the reader found, oldest first
        self._reader: threading.Thread | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()  # the reader's first answer (paused? cancelled?)
        #: the run had lifecycle facts before this process (None: not read yet)
        self.known: bool | None = None
        #: a restarted process that got no first answer says so at its first look
        self._restart_unread = False
        self._open_failed = threading.Event()  # the reader's first try found no log

    def obey(self, step: int | None, waiting: Callable[[], None] | None = None) -> bool:
        """Act on the run's new commands; True once it is cancelled (stop training). Takes
        what the reader found (no I/O here unless it pauses). ``waiting``: called every
        ``poll_s`` while paused (a multi-process run's keepalive, :mod:`.ranks`)."""
        if self._reader is None:  # the first look: the reader's first answer (docstring)
            self._wait_first_answer()
        if self._restart_unread and not self._ready.is_set():
            self._restart_unread = False
            self._say("restart-wait", f"runwatch: run {self.run_id}'s commands were not "
                      f"read in {RESTART_WAIT_S:g} s: training without knowing whether "
                      "it is paused")  # fmt: skip
        if self.cancelled:
            return True
        queue: deque[Any] = deque(self._take())
        if self.still_paused is not None:  # the run was paused when this process started
            reason, self.still_paused = STILL_PAUSED + self.still_paused, None
            if self._hold(reason, ("", "", ""), step, queue, waiting):
                return True
        while queue:
            if self._cancel_due(queue, step):
                return True
            cmd = queue.popleft()
            if isinstance(cmd, PauseRequested):
                who = f"{cmd.actor}{' ' + cmd.principal if cmd.principal else ''}"
                why = f"paused by {who}: {cmd.reason}"
                request = (str(cmd.event_id), cmd.actor, cmd.alert_id)
                if self._hold(why, request, step, queue, waiting):
                    return True
        return False

    def run_is_paused(self) -> bool:
        """Was the run paused (or cancelled) when this restarted process started? Waits
        for the reader's first answer up to ``RESTART_WAIT_S``, or until its first try
        finds no log (unreachable, a key refused: it cannot answer before ``RETRY_S``);
        none by then is taken as no, said at the first :meth:`obey`, which waits no more."""
        self._wait_first_answer()
        return self.still_paused is not None or self.cancelled

    def _wait_first_answer(self) -> None:
        """Start the reader and wait for its first answer up to ``RESTART_WAIT_S``, or
        until its first try finds no log; none by then is said at the first look."""
        self._start_reader()
        deadline = time.monotonic() + RESTART_WAIT_S
        while not self._ready.wait(0.05):  # a log that cannot be reached: no wait for it
            if self._open_failed.is_set() or time.monotonic() >= deadline:
                break
        self._restart_unread = not self._ready.is_set()

    def close(self) -> None:
        self._stop.set()
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=KAFKA_WAIT_S + 1)
        sink, self._sink, self._feed = self._sink, None, None
        if sink is not None:
            with contextlib.suppress(Exception):  # closing a reader never fails the run
                sink.close()

    # -- acting ------------------------------------------------------------------------
    def _cancel_due(self, queue: deque[Any], step: int | None) -> bool:
        cancel = first_cancel(queue)
        if cancel is None:
            return False
        queue.clear()
        reason = f"cancelled by {cancel.actor}: {cancel.reason}".rstrip(": ")
        self.publish(RunCancelled, step, reason=reason, request_id=str(cancel.event_id))
        self.flush()
        self.cancelled = True
        return True

    def _hold(
        self,
        reason: str,
        request: tuple[str, str, str],
        step: int | None,
        queue: deque[Any],
        waiting: Callable[[], None] | None = None,
    ) -> bool:
        """Paused until an unpause (False) or a cancel (True); ``waiting()`` every poll.
        ``request``: the pause request answered (its id, actor and alert id; all '' for
        none: a restart still paused)."""
        t0 = time.perf_counter()
        request_id, requested_by, alert_id = request
        # the pause a resume must name (when it names one): this request's, or the one in
        # effect when this process started (a restart still paused)
        pause_id = request_id or self.still_paused_id or ""
        self.publish(
            RunPaused,
            step,
            reason=reason,
            request_id=request_id,
            requested_by=requested_by,
            alert_id=alert_id,
            refuses_stale_resume=True,  # a resume naming another pause is refused below
        )
        self.flush()
        log.warning("runwatch: run %s paused at step %s: %s", self.run_id, step, reason)
        deferred: list[PauseRequested] = []  # people's pauses while paused (below)
        while True:
            if waiting is not None:
                waiting()
            if not queue:
                with contextlib.suppress(Empty):
                    queue.append(self._inbox.get(timeout=self.poll_s))
                queue.extend(self._take())
                continue
            if self._cancel_due(queue, step):
                return True
            c = queue.popleft()
            if not isinstance(c, UnpauseRequested):
                if held_over(c):  # a person's pause of the paused run: after the resume
                    deferred.append(c)
                continue
            if stale := stale_resume(c, pause_id):
                self._refuse(c, stale)
                continue
            why = f"resumed by {c.actor}: {c.reason}".rstrip(": ")
            if c.overrides:
                kept = ", ".join(f"{k}={v}" for k, v in dict(c.overrides).items())
                why += f" (not applied: a hooked trainer takes no settings: {kept})"
            self.publish(RunResumed, step, reason=why, request_id=str(c.event_id))
            self.flush()
            self.paused_s += time.perf_counter() - t0
            self.still_paused_id = None
            log.warning("runwatch: run %s resumed at step %s by %s", self.run_id, step, c.actor)
            queue.extendleft(reversed(deferred))  # paused again for them (:meth:`obey`)
            return False

    def _refuse(self, command: UnpauseRequested, why: str) -> None:
        """A resume that names another pause than the one in effect is not acted on: said
        in the log and, where the hook may write the control topic (the embedded log,
        Kafka; not the ingest gateway, which takes a run's own facts only), recorded as a
        ``CommandRejected``."""
        log.warning("runwatch: run %s: resume %s refused: %s", self.run_id, command.event_id, why)
        if self.backend is not None:
            return
        with contextlib.suppress(Exception):  # a record of the refusal never fails the run
            self.publish(
                CommandRejected,
                None,
                command_id=str(command.event_id),
                command=type(command).__name__,
                reason=why,
            )
            self.flush()

    # -- reading (the reader thread) --------------------------------------------------
    def _start_reader(self) -> None:
        if self._reader is None:
            self._reader = threading.Thread(
                target=self._read, name=f"runwatch-commands-{self.run_id}", daemon=True
            )
            self._reader.start()

    def _take(self) -> list[Any]:
        """What the reader found since the last take (never blocks)."""
        out = []
        with contextlib.suppress(Empty):
            while True:
                out.append(self._inbox.get_nowait())
        return out

    def _read(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            feed = self._feed or self._open(began)
            if feed is not None:
                try:
                    for cmd in feed.poll():
                        self._inbox.put(cmd)
                except Exception as exc:  # the target is away: no command this time
                    self._read_failed(began)
                    why = f"{type(exc).__name__}: {exc}".rstrip(": ")
                    self._say("poll", f"runwatch: cannot read run {self.run_id}'s commands: {why}")
                else:
                    self._read_ok(began)
            self._stop.wait(self.poll_s)

    def _read_ok(self, began: float) -> None:
        failing = self.unread_since is not None
        self.read_ok_at, self.unread_since = began, None
        if failing and self.on_reachable is not None:
            with contextlib.suppress(Exception):  # (a publisher's wake-up: never fails)
                self.on_reachable()

    def _read_failed(self, began: float) -> None:
        if self.unread_since is None:
            self.unread_since = began

    def _open(self, began: float | None = None) -> CommandFeed | None:
        """The feed, made at the first look that can make it (an unreachable target is
        tried again after ``RETRY_S``; no call waits on Kafka more than ``KAFKA_WAIT_S``)."""
        from producers.sinks import BackendSink, EmbeddedSink, KafkaSink

        if time.monotonic() < self._retry_at:
            return None
        if self._stop.is_set():
            return None
        try:
            if self.backend is not None:
                self._sink = BackendSink(self.backend(), timeout_s=KAFKA_WAIT_S)
            elif self.kafka:
                self._sink = KafkaSink(self.kafka, timeout_s=KAFKA_WAIT_S)
            else:
                if not self.log_dir.is_dir():
                    self.known = False  # nothing written yet: not paused, no command either
                    self._ready.set()
                    self._read_ok(time.monotonic() if began is None else began)
                    return None
                from events.log.embedded import EmbeddedLog

                reader = EmbeddedLog(self.log_dir, readonly=True)
                reader.open_sync()
                self._sink = EmbeddedSink(reader)
            backend = self._sink if isinstance(self._sink, BackendSink) else None
            if backend is not None:
                backend.timeout_s = OPEN_WAIT_S  # the first read may be long; polls are not
            every = _lifecycle(
                self._sink, self.run_id, self.tenant_id, self.producer, _BEGINNINGS + _ENDINGS
            )
            facts = [e for e in every if isinstance(e, _ENDINGS)]
            answered = answered_requests(facts)
            paused = paused_reason(facts)
            self.still_paused = paused.removeprefix(STILL_PAUSED) if paused is not None else None
            pause = pause_in_effect(facts) if paused is not None else None
            self.still_paused_id = pause.id if pause is not None else None
            # a process started for a run cancelled before: it stops at once
            self.cancelled = bool(facts) and isinstance(facts[-1], RunCancelled)
            self.known = bool(every)
            self._feed = CommandFeed(
                self._sink,
                self.run_id,
                answered=answered,
                tenant_id=self.tenant_id,
                superseded=last_answered(facts),
            )
            for cmd in self._feed.poll():  # every command so far, read with the long wait
                self._inbox.put(cmd)
            if backend is not None:
                backend.timeout_s = KAFKA_WAIT_S
            self._ready.set()
        except Exception as exc:  # (on the reader thread: it tries again later)
            self._read_failed(time.monotonic() if began is None else began)
            self._open_failed.set()
            sink, self._sink = self._sink, None
            if sink is not None:
                with contextlib.suppress(Exception):
                    sink.close()
            self._retry_at = time.monotonic() + RETRY_S
            why = f"{type(exc).__name__}: {exc}".rstrip(": ")
            self._say("open", f"runwatch: cannot follow run {self.run_id}'s commands: {why}")
            return None
        return self._feed

    def _say(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(message)


_ENDINGS = (RunPaused, RunResumed, RunCancelled, RunCompleted, RunFailed)
_BEGINNINGS = (RunSubmitted, RunStarted)


def _lifecycle(
    sink: Any, run_id: str, tenant_id: str, producer: str, kinds: tuple[type, ...] = _ENDINGS
) -> list[EventBase]:
    """The run's pauses, resumes and ends (``kinds``) written before this process (not by
    its own hook: ``producer``), in order."""
    from events.codec import decode
    from producers.sinks import EmbeddedSink

    key = run_id.encode()  # lifecycle facts are keyed by their run: others not decoded
    if isinstance(sink, EmbeddedSink):
        names = sink.log.topic_names()
        records = sink.log.read_sync(LIFECYCLE, 0) if LIFECYCLE in names else iter(())
    else:
        records = sink._call(read_to_end(sink.backend, LIFECYCLE, {}))
    facts = (decode(r.value) for r in records if r.key is None or r.key == key)
    return [
        e
        for e in facts
        if isinstance(e, kinds)
        and e.run_id == run_id
        and e.tenant_id == tenant_id
        and e.producer != producer
    ]
