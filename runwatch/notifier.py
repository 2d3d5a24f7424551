"""The notifier host: :class:`~stream_processors.notify.NotifierFold` plus its I/O.

It runs off the pipeline — its own process (``runwatch notify``) and consumer group
(``runwatch-notifier``) over ``runwatch.run-states``, ``runwatch.alerts`` and
``runwatch.notifications`` on any :class:`~events.log.base.LogBackend` — so a slow or
dead receiver never delays a detector or a projection: they do not wait for it, and a
backlog here is just an offset lag.

One loop turn (one asyncio task; deliveries are tasks of their own): poll new records
(every ``poll_timeout_s`` while idle, at once while there is a backlog) and fold them
(per-run slots deduplicated by event id, as every host does: :mod:`runwatch.hosting.core`);
fold in the attempts that finished since the last turn; append all of it in one write
(each ``NotificationAttempted`` followed by the ``NotificationDelivered`` /
``NotificationAbandoned`` the fold derived from it: a group commit, one fsync per turn,
not per attempt); every ``save_every_s`` write the state file and then commit the group;
start every due delivery (:func:`stream_processors.notify.due`). A finished POST wakes the
loop at once. A delivery POSTs the body with the signature headers
(:mod:`stream_processors.notify.signing`) and hands back what it observed; an attempt
read back from the log later is a duplicate and is skipped. If the log refuses an append,
the notifier stops without saving (a restart makes those attempts again).

Limits: ``timeout_s`` per attempt, one deadline over all of it (the destination check,
connect, send, the answer's headers and its body — not per socket read: an endpoint that
answers a byte at a time is cut off at ``timeout_s`` like a silent one, a failed attempt
"timeout: no complete answer within N s", retried and abandoned as usual); at most
``max_in_flight`` POSTs at once, ``per_tenant_in_flight`` per tenant (one slow tenant
cannot take every slot), and one per run (a run's first attempts leave in log order; a
notification in backoff does not hold back the run's later ones). Redirects are not
followed (a 3xx is a failure); an answer body is read up to 64 KiB (to keep the connection
alive), no further.

Crash safety (at-least-once, nothing lost): the state file holds the positions and every
run's pending notifications and attempt counts (a snapshot and a journal of saves beside
it: :mod:`runwatch.hosting.state_journal`), written before the group commits; records
before the stored positions are skipped. After a ``kill -9`` the restarted notifier reads
its uncommitted tail again (the fold absorbs what it already knew) and sends nothing until
it has read every input up to where it ended at the start (``catch_up_s`` at most), so the
attempts its predecessor recorded after its last save are known first; then it re-sends
every pending notification whose attempt was not recorded — at most the ones in flight at
the kill, with the same ``X-Runwatch-Delivery`` id — and nothing else twice. (The log may
hold an outcome twice, same event id, when the kill fell between its append and the
save: consumers deduplicate by id, as everywhere.)

Webhooks come from the keys file (``tenants.<id>.webhook``, :mod:`projections.keys`); it is
watched (a changed file is loaded again; a broken edit keeps the last valid webhooks). A
tenant without a webhook gets nothing queued (counted: ``runwatch_notifications_unroutable_
total``); a notification whose tenant lost its webhook fails its attempts ("no webhook
configured") until abandoned (counted: ``runwatch_notifications_abandoned_total``).

Metrics (:class:`NotifierCollector`, ``runwatch notify --metrics-port``, loopback by
default): what was told to nobody, by ``kind`` and ``urgent`` (a paging alert's fire, a run
paused by a gate), the attempts, and ``runwatch_notifier_last_poll_timestamp_seconds`` (the
loop's liveness, for the ``RunwatchNotifierStalled`` rule). Read at scrape time from the
host's counters: the fold knows nothing of them.

Host-side time: the clock stamps the attempts it observes (``ts``) and is compared with
:func:`~stream_processors.notify.due_at`; the fold itself never reads it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from events.catalog.notify import (
    NotificationAbandoned,
    NotificationAttempted,
    NotificationDelivered,
)
from events.codec import decode, records_by_topic
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.log.base import LogBackend, Record
from projections.keys import Webhook, load_webhooks
from runwatch.hosting.core import Slot, apply_event, dump_slot, load_slot, new_slot
from runwatch.hosting.state_journal import FoldStateFile
from runwatch.hosting.tenancy import foreign_owner
from runwatch.webhook_guard import destination_refusal, public_only_transport
from stream_processors.notify import NotifierFold, NotifyPolicy, Pending, attempt_event, due
from stream_processors.notify.fold import MAX_PENDING, SUPERSEDED
from stream_processors.notify.payload import KINDS, data_of
from stream_processors.notify.signing import (
    ATTEMPT_HEADER,
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    signature,
)

log = logging.getLogger("runwatch.notifier")

DEFAULT_GROUP = "runwatch-notifier"
USER_AGENT = "runwatch-notifier/1"
#: Answer bodies up to this size are read (and dropped) to keep the connection alive.
MAX_ANSWER_BYTES = 64 * 1024
_KIND_OF_TYPE = {cls.__name__: kind for cls, kind in KINDS.items()}


@dataclass
class NotifierSettings:
    group_id: str = DEFAULT_GROUP
    #: Positions + slots (``None``: kept in memory only; a restart starts over).
    state_path: Path | None = None
    #: One deadline per attempt (seconds from its start: destination check, connect, send,
    #: the answer's headers and body), not per socket read.
    timeout_s: float = 10.0
    max_in_flight: int = 32
    per_tenant_in_flight: int = 4
    poll_records: int = 1000
    #: Longest idle wait between polls (a finished attempt wakes the loop at once).
    poll_timeout_s: float = 0.02
    #: How often the state file is written (then the group committed), at most.
    save_every_s: float = 0.1
    #: How often the keys file is checked for changes.
    reload_every_s: float = 1.0
    #: On stop, how long in-flight deliveries may finish before they are cancelled.
    grace_s: float = 5.0
    #: Where a notifier without a state file starts: ``earliest`` (every retained fact is
    #: notified) or ``latest`` (only facts appended from now on).
    start: str = "earliest"
    #: After a start, nothing is sent until the inputs were read to where they ended at
    #: the start (what a killed predecessor recorded is known first), or this long.
    catch_up_s: float = 30.0
    #: POST to webhooks whose host resolves to a private, loopback or link-local address
    #: (``runwatch/webhook_guard.py``); off: such an attempt fails without a connection.
    allow_private: bool = False


class _Refused(Exception):
    """A webhook destination the guard refused (the attempt fails, no connection made)."""


@dataclass
class NotifierStats:
    records: int = 0
    skipped: int = 0  # before the stored positions (already folded)
    duplicates: int = 0
    dead_letters: int = 0
    refused: int = 0  # another tenant's event on a run id (never sent to that run's hook)
    attempts: int = 0
    failures: int = 0
    delivered: int = 0
    abandoned: int = 0
    #: customer-visible facts of tenants without a webhook (told to nobody)
    unroutable: int = 0
    latencies_s: list[float] = field(default_factory=list, repr=False)
    #: (kind, urgent) -> notifications abandoned / facts unroutable (the metrics' labels)
    abandoned_by: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)
    unroutable_by: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)
    #: wall clock when the loop last polled its inputs (None: not yet): its liveness
    last_poll_ts: float | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for name in ("latencies_s", "abandoned_by", "unroutable_by", "last_poll_ts"):
            d.pop(name)
        return d


def urgent(kind: str, data: dict[str, Any]) -> bool:
    """Whether a notification asks the customer to act: a paging alert's fire, or a run
    paused by a gate (its body's ``data``: :func:`stream_processors.notify.payload.data_of`)."""
    if kind == "alert.fired":
        return data.get("routing") == "page"
    if kind == "run.state_changed":
        return data.get("to_state") == "PAUSED_BY_GATE"
    return False


def _urgent_body(kind: str, body: str) -> bool:
    try:
        data = json.loads(body).get("data") or {}
    except (ValueError, AttributeError):
        return False
    return urgent(kind, data if isinstance(data, dict) else {})


class WebhookBook:
    """Tenant -> webhook from a keys file, loaded again when the file changes."""

    def __init__(self, path: str | Path | None = None, hooks: dict[str, Webhook] | None = None):
        self.path = Path(path) if path is not None else None
        self.hooks: dict[str, Webhook] = dict(hooks or {})
        self.error: str | None = None
        self._stamp: tuple[int, ...] | None = None
        if self.path is not None:
            self._stamp = self._stat()
            self.hooks = load_webhooks(self.path)  # a ValueError: refuse to start

    def _stat(self) -> tuple[int, ...] | None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def maybe_reload(self) -> bool:
        """Load the file again if it changed; ``True`` when new webhooks were applied."""
        if self.path is None:
            return False
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            hooks = load_webhooks(self.path)
        except ValueError as exc:
            if str(exc) != self.error:
                self.error = str(exc)
                log.error("webhooks not reloaded: %s; keeping the previous ones", exc)
            return False
        self.error = None
        self.hooks = hooks
        log.info("webhooks reloaded from %s (%d tenants)", self.path, len(hooks))
        return True


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` header's delay in seconds (the HTTP-date form is ignored)."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def headers_for(p: Pending, attempt: int, secret: bytes, body: bytes, now: float) -> dict[str, str]:
    ts = int(now)
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        TIMESTAMP_HEADER: str(ts),
        SIGNATURE_HEADER: signature(secret, ts, body),
        DELIVERY_HEADER: p.notification_id,
        ATTEMPT_HEADER: str(attempt),
        EVENT_HEADER: _KIND_OF_TYPE.get(p.source_type, p.source_type),
    }


async def _drain_body(resp: httpx.Response, limit: int = MAX_ANSWER_BYTES) -> None:
    """Read (and drop) a small answer body, so the connection is kept alive for the next
    POST; a larger one is not read further (the connection is closed instead)."""
    seen = 0
    async for chunk in resp.aiter_raw():
        seen += len(chunk)
        if seen > limit:
            return


class Notifier:
    """Fold + deliveries over one backend. ``run(stop)`` until ``stop`` is set."""

    def __init__(
        self,
        backend: LogBackend,
        book: WebhookBook,
        *,
        policy: NotifyPolicy | None = None,
        settings: NotifierSettings | None = None,
        clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.backend = backend
        self.book = book
        self.settings = settings or NotifierSettings()
        base = policy or NotifyPolicy()
        self.fold = NotifierFold(dataclasses.replace(base, tenants=frozenset(book.hooks)))
        self.clock = clock
        self.transport = transport
        self.stats = NotifierStats()
        self.positions: dict[str, int] = {}  # "topic:partition" -> next offset
        self.slots: dict[str, Slot] = {}
        self._state: FoldStateFile | None = None
        self._dirty: set[str] = set()
        self._active: set[str] = set()  # runs with pending notifications
        #: run -> its notification being sent (or sent, its attempt not yet recorded)
        self._in_flight: dict[str, Pending] = {}
        self._superseded = 0  # notifications abandoned over a run's MAX_PENDING (logged)
        self._per_tenant: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: attempts made, to be recorded (one append per loop turn: a group commit)
        self._completed: list[tuple[str, NotificationAttempted]] = []
        self._next_wake = 0.0
        self._changed = True
        self._broken = False
        #: input partitions not yet read to their end as of the start -> that end offset
        self._catching_up: dict[str, int] = {}
        self._catch_up_deadline = 0.0
        self._wake = asyncio.Event()  # set when an attempt finished
        self._client: httpx.AsyncClient | None = None
        self._load()

    # -- state file -----------------------------------------------------------------------
    def _load(self) -> None:
        path = self.settings.state_path
        if path is None:
            return
        self._state = FoldStateFile(Path(path), self.fold.name)
        self._state.load()
        self.positions = dict(self._state.positions)
        for key, raw in self._state.slots.items():
            slot = self.slots[key] = load_slot(self.fold, base64.b64decode(raw))
            if slot.state.pending:
                self._active.add(key)

    def save(self) -> None:
        """Make the positions and the changed slots durable: one journal line beside the
        state file's snapshot (:mod:`runwatch.hosting.state_journal`: a save writes what
        changed, not every run's state)."""
        if self._state is None:
            self._dirty.clear()
            return
        changed = {
            key: base64.b64encode(dump_slot(self.fold, self.slots[key])).decode()
            for key in self._dirty
        }
        self._state.commit(dict(self.positions), changed)
        self._dirty.clear()  # only once durable: a failed save is made again in full

    # -- folding --------------------------------------------------------------------------
    def _apply(self, event: EventBase) -> Sequence[EventBase]:
        key = self.fold.key_of(event)
        slot = self.slots.get(key)
        if slot is None:
            slot = self.slots[key] = new_slot(self.fold)
        if foreign_owner(slot, event) is not None:
            self.stats.refused += 1  # another tenant's run: never that run's webhook
            return ()
        out = apply_event(self.fold, slot, event)
        if out is None:
            self.stats.duplicates += 1
            return ()
        self._dirty.add(key)
        if slot.state.pending:
            self._active.add(key)
        if type(event) in KINDS and not self.fold.policy.notifies(event.tenant_id):
            self._unroutable(event)
        self._changed = True
        return out

    def _unroutable(self, event: EventBase) -> None:
        """Count a customer-visible fact of a tenant without a webhook: the fold queues
        nothing for it, so without this count nobody would know it was told to nobody."""
        kind = KINDS[type(event)]
        if kind == "alert.resolved":
            return  # its fire was not sent either (counted there)
        if kind == "alert.fired" and getattr(event, "routing", "") == "advisory":
            return  # never sent to anyone: not a lost notification
        is_urgent = urgent(kind, data_of(event))
        key = (kind, "true" if is_urgent else "false")
        self.stats.unroutable += 1
        self.stats.unroutable_by[key] = self.stats.unroutable_by.get(key, 0) + 1
        if is_urgent:
            log.warning(
                "no webhook for tenant %r: %s of run %s told to nobody",
                event.tenant_id, kind, event.run_id,
            )  # fmt: skip

    def fold_records(self, records: Sequence[Record]) -> list[EventBase]:
        """Fold a polled batch (records before the stored positions are skipped)."""
        derived: list[EventBase] = []
        for rec in records:
            where = f"{rec.topic}:{rec.partition}"
            if rec.offset < self.positions.get(where, 0):
                self.stats.skipped += 1
                continue
            self.positions[where] = rec.offset + 1
            self.stats.records += 1
            event = decode(rec.value)
            if isinstance(event, DeadLetter):
                self.stats.dead_letters += 1  # the processors dead-letter it; we move on
                continue
            derived.extend(self._apply(event))
        return derived

    def record_completed(self) -> list[EventBase]:
        """Fold in the attempts made since the last turn; each attempt followed by what
        the fold derived from it (what to append, in order)."""
        completed, self._completed = self._completed, []
        out: list[EventBase] = []
        for key, ev in completed:
            self._in_flight.pop(key, None)
            self._per_tenant[ev.tenant_id] -= 1
            self._changed = True  # the run and the tenant have a free slot again
            self.stats.attempts += 1
            self.stats.failures += not ev.ok
            if ev.event_id in self.slots[key].recent:
                # the log already holds this attempt (another process made it, e.g. the one
                # killed before this one started): never a second record with its id
                self.stats.duplicates += 1
                log.warning("attempt %d of %s was recorded already", ev.attempt, ev.notification_id)
                continue
            out.append(ev)
            out.extend(self._apply(ev))
        return out

    async def publish(self, events: Sequence[EventBase]) -> None:
        try:
            for topic, records in records_by_topic(events).items():
                await self.backend.append_many(topic, records)
        except Exception:
            # the attempts are folded in but not on the log: never save that state; the
            # process stops and a restart makes those attempts again
            self._broken = True
            raise
        for ev in events:
            if isinstance(ev, NotificationDelivered):
                self.stats.delivered += 1
                self.stats.latencies_s.append(ev.latency_s)
            elif isinstance(ev, NotificationAbandoned):
                self.stats.abandoned += 1
                kind = _KIND_OF_TYPE.get(ev.source_type, "other")
                key = (kind, "true" if _urgent_body(kind, ev.body or "") else "false")
                self.stats.abandoned_by[key] = self.stats.abandoned_by.get(key, 0) + 1
                if not ev.reason.startswith(SUPERSEDED):
                    log.warning("abandoned %s: %s", ev.notification_id, ev.reason)
                    continue
                if self._superseded % 1000 == 0:  # a flood of them: said once a thousand
                    log.warning("abandoned %s (run %s): %s; %d superseded so far",
                                ev.notification_id, ev.run_id, ev.reason,
                                self._superseded + 1)  # fmt: skip
                self._superseded += 1

    # -- deliveries -----------------------------------------------------------------------
    def dispatch(self) -> None:
        """Start every due delivery the limits allow (cheap when nothing changed)."""
        if self._client is None:
            return
        s = self.settings
        now = self.clock()
        if not self._changed and now < self._next_wake:
            return
        if self._catching_up and not self._caught_up():
            return
        self._changed = False
        next_wake = float("inf")
        for key in list(self._active):
            slot = self.slots[key]
            if not slot.state.pending:
                self._active.discard(key)
                continue
            if key in self._in_flight:
                continue
            candidates = due(slot.state, self.fold.policy)
            if len(slot.state.pending) >= MAX_PENDING:
                # at its cap the fold may supersede any of the run's but its first sendable
                # one: only that one is sent, so none in flight is ever superseded
                candidates = candidates[:1]
            for at, p in candidates:
                if at > now:
                    next_wake = min(next_wake, at)
                    continue
                if len(self._in_flight) >= s.max_in_flight:
                    self._next_wake = now  # a recorded attempt dispatches again
                    return
                if self._per_tenant.get(p.tenant_id, 0) >= s.per_tenant_in_flight:
                    break
                self._start(key, p)
                break
        self._next_wake = next_wake

    def _caught_up(self) -> bool:
        """Whether every input partition was read up to its end as of the start (or the
        wait ran out): until then nothing is sent, so attempts a killed predecessor made
        after its last save are known before anything is sent again."""
        behind = {w for w, end in self._catching_up.items() if self.positions.get(w, 0) < end}
        if behind and time.monotonic() < self._catch_up_deadline:
            self._catching_up = {w: self._catching_up[w] for w in behind}
            return False
        if behind:
            log.warning("still behind on %s after %g s; sending anyway", sorted(behind),
                        self.settings.catch_up_s)  # fmt: skip
        self._catching_up = {}
        return True

    def _start(self, key: str, p: Pending) -> None:
        self._in_flight[key] = p
        self._per_tenant[p.tenant_id] = self._per_tenant.get(p.tenant_id, 0) + 1
        task = asyncio.get_running_loop().create_task(self._deliver(key, p, p.attempts + 1))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, key: str, p: Pending, attempt: int) -> None:
        attempted = await self._attempt(p, attempt)
        self._completed.append((key, attempted))  # the list now, not the one before the await
        self._wake.set()

    async def _attempt(self, p: Pending, attempt: int) -> NotificationAttempted:
        """POST ``p`` once and return what was observed (never raises but on cancellation).

        Time: the whole attempt — the destination check (its DNS lookup), connecting,
        sending, the answer's status line and headers, and reading its body — runs under one
        deadline, ``timeout_s`` after the attempt starts (monotonic clock). The HTTP client's
        own timeout bounds each socket operation only, so an endpoint that answers a byte at
        a time would otherwise hold the POST, its run and a tenant slot open for ever. When
        the deadline passes, the request is cancelled (its connection closed, not reused) and
        the attempt is a failure without a status ("timeout: no complete answer within N s"),
        even when a 2xx status line had arrived: the fold retries it, then abandons it.
        ``duration_ms`` is monotonic time from the start to the outcome; ``ts`` is
        ``clock()`` at the outcome."""
        assert self._client is not None and p.body is not None
        client = self._client
        hook = self.book.hooks.get(p.tenant_id)
        started = time.monotonic()
        status: int | None = None
        error, retry_after = "", None
        if hook is None:
            error = f"no webhook configured for tenant {p.tenant_id!r}"
        else:
            body = p.body.encode()
            headers = headers_for(p, attempt, hook.secret, body, self.clock())
            timeout_s = self.settings.timeout_s
            seen: list[int] = []  # the answer's status, once its headers arrived
            try:
                async with asyncio.timeout(timeout_s):
                    refusal = (
                        "" if self.settings.allow_private else await destination_refusal(hook.url)
                    )
                    if refusal:
                        raise _Refused(refusal)
                    async with client.stream(
                        "POST", hook.url, content=body, headers=headers
                    ) as resp:
                        seen.append(resp.status_code)
                        retry_after = retry_after_s(resp.headers.get("retry-after"))
                        await _drain_body(resp)
                status = seen[0]  # a complete answer, in time
            except _Refused as exc:
                error = str(exc)
            except (TimeoutError, httpx.TimeoutException):
                # the deadline (or one socket operation) ran out: no complete answer
                error = f"timeout: no complete answer within {timeout_s:g} s"
                if seen:
                    error += f" (HTTP {seen[0]} headers arrived, the body did not)"
            except Exception as exc:  # refused, reset, DNS, TLS...: a failed attempt
                error = f"{type(exc).__name__}: {exc}"[:300]
        ok = status is not None and 200 <= status < 300
        return attempt_event(
            p,
            attempt,
            ts=self.clock(),
            ok=ok,
            status_code=status,
            error=error,
            duration_ms=round((time.monotonic() - started) * 1000, 3),
            retry_after_s=None if ok else retry_after,
            endpoint=hook.endpoint if hook is not None else "",
        )

    # -- the loop -------------------------------------------------------------------------
    def _reload(self) -> None:
        if self.book.maybe_reload():
            tenants = frozenset(self.book.hooks)
            self.fold.policy = dataclasses.replace(self.fold.policy, tenants=tenants)
            self._changed = True

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        if s.start == "latest" and not self.positions:  # first start: skip the history
            for topic in self.fold.inputs:
                for partition in await self.backend.partitions(topic):
                    end = await self.backend.end_offset(topic, partition)
                    self.positions[f"{topic}:{partition}"] = end
        self._catching_up = {}
        for topic in self.fold.inputs:
            for partition in await self.backend.partitions(topic):
                end = await self.backend.end_offset(topic, partition)
                if end > self.positions.get(f"{topic}:{partition}", 0):
                    self._catching_up[f"{topic}:{partition}"] = end
        self._catch_up_deadline = time.monotonic() + s.catch_up_s
        consumer = await self.backend.consumer(s.group_id, list(self.fold.inputs))
        member = getattr(consumer, "positions", None)
        if isinstance(member, dict):  # the embedded consumer: start from the stored positions
            for where, offset in self.positions.items():
                topic = where.rsplit(":", 1)[0]
                if topic in member:
                    member[topic] = max(member[topic], offset)
        limits = httpx.Limits(max_connections=s.max_in_flight, max_keepalive_connections=16)
        transport = self.transport
        if transport is None and not s.allow_private:  # checked again at connect time
            transport = public_only_transport(limits)
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(s.timeout_s),
            limits=limits,
            follow_redirects=False,
            trust_env=False,
            transport=transport,
        )
        self._client = client
        uncommitted = False
        last_save = last_reload = time.monotonic()
        try:
            next_poll = 0.0
            while not stop.is_set():
                self._wake.clear()
                records: list[Record] = []
                if time.monotonic() >= next_poll:  # not on every finished attempt: a poll
                    records = await consumer.poll(s.poll_records, timeout_s=0.0)  # costs
                    self.stats.last_poll_ts = time.time()  # liveness, for the metrics
                    # a backlog is read on at once; else look again after poll_timeout_s
                    next_poll = 0.0 if records else time.monotonic() + s.poll_timeout_s
                out = self.record_completed()
                if records:
                    out.extend(self.fold_records(records))
                    uncommitted = True
                if out:
                    await self.publish(out)
                mono = time.monotonic()
                if (self._dirty or uncommitted) and mono - last_save >= s.save_every_s:
                    self.save()  # positions and slots first, then the group
                    if uncommitted:
                        await consumer.commit()
                        uncommitted = False
                    last_save = mono
                if mono - last_reload >= s.reload_every_s:
                    self._reload()
                    last_reload = mono
                self.dispatch()
                if not records and not self._completed:
                    # idle: wait for a finished attempt, the next poll or a due retry
                    wait = max(0.0, next_poll - time.monotonic())
                    if self._next_wake < float("inf"):
                        wait = max(0.0, min(wait, self._next_wake - self.clock()))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), wait)
        finally:
            self._client = None  # no new deliveries
            if not self._broken:
                await self._drain(s.grace_s)
            if not self._broken:
                self.save()
                with contextlib.suppress(Exception):
                    await consumer.commit()
            await consumer.close()
            await client.aclose()

    async def _drain(self, grace_s: float) -> None:
        """On stop: let deliveries in flight finish (up to ``grace_s``) and record them."""
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        out = self.record_completed()
        if out:
            with contextlib.suppress(Exception):
                await self.publish(out)

    # -- read-outs ------------------------------------------------------------------------
    def pending(self) -> int:
        return sum(len(self.slots[k].state.pending) for k in self._active if k in self.slots)


# -- metrics (read at scrape time; runwatch notify --metrics-port) -------------------------
class NotifierCollector:
    """The notifier's own series, read from its host-side counters at scrape time: what was
    told to nobody (abandoned after its retries; a tenant without a webhook) and whether the
    loop is alive. Labels come from closed sets: ``kind`` (the body's ``type``) and
    ``urgent`` (``true``: a paging alert's fire or a run paused by a gate). Every label pair
    is exported from the start, at 0, so ``increase()`` sees the first one."""

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self._pending = 0

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.notifier.stats
        for name, doc, counts in (
            (
                "runwatch_notifications_abandoned",
                "Notifications abandoned after their last failed attempt (told to nobody).",
                dict(stats.abandoned_by),
            ),
            (
                "runwatch_notifications_unroutable",
                "Customer-visible alerts and state changes of tenants without a webhook "
                "(nothing queued: told to nobody).",
                dict(stats.unroutable_by),
            ),
        ):
            c = CounterMetricFamily(name, doc, labels=["kind", "urgent"])
            for kind in sorted(_KIND_OF_TYPE.values()):
                for flag in ("false", "true"):
                    c.add_metric([kind, flag], counts.get((kind, flag), 0))
            yield c
        for name, doc, value in (
            ("runwatch_notifications_attempts", "Delivery attempts made.", stats.attempts),
            ("runwatch_notifications_failed_attempts", "Attempts that failed.", stats.failures),
            ("runwatch_notifications_delivered", "Notifications delivered.", stats.delivered),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c
        # the loop's sets change under this thread: on a clash keep the last good count
        with contextlib.suppress(RuntimeError):
            self._pending = self.notifier.pending()
        g = GaugeMetricFamily("runwatch_notifications_pending", "Notifications not yet settled.")
        g.add_metric([], self._pending)
        yield g
        if stats.last_poll_ts is not None:
            g = GaugeMetricFamily(
                "runwatch_notifier_last_poll_timestamp_seconds",
                "Wall clock when the notifier last polled its inputs (its loop is alive).",
            )
            g.add_metric([], stats.last_poll_ts)
            yield g


def start_metrics(notifier: Notifier, port: int, host: str = "127.0.0.1") -> Any:
    """Serve the notifier's ``/metrics`` on ``host:port`` (loopback by default); the server."""
    from prometheus_client.registry import CollectorRegistry

    from projections.exporter import start_metrics_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(NotifierCollector(notifier))  # type: ignore[arg-type]
    server, _ = start_metrics_server(registry, port, host)
    return server
