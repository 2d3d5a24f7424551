"""The embedded host: the processors' folds over an :class:`~events.log.embedded.EmbeddedLog`.

One :class:`~runwatch.hosting.host.Host` over the union of the folds' input topics, read
once from the stored positions (merged in the log's deterministic order) and decoded once
for every fold that reads the record. Undecodable records go to ``runwatch.dead-letters``
once (stamped with where they were read), and a record a fold raised on once per fold that
raised (``fold_failed``); the dead-letter group's positions remember which were written,
one high-water mark per stream of letters (:func:`letter_stream`), so a batch re-run after
a crash writes none twice; events are deduplicated by ``event_id`` per key
(:mod:`runwatch.hosting.core`); what the folds derive is appended to its topics.

Durability (the eventsourcing tracking-record idea): every ``batch_records`` records the
host appends the batch's derived events, *then* writes one state file per fold —
positions and every key's slot together, atomically (:class:`~runwatch.hosting.stores.
StateFiles`). A crash between the two re-runs the batch on restart: the same derived
events (same ids) are appended again, which consumers deduplicate (at-least-once, never
lost). The positions can never run ahead of the state. A fold added later starts from
offset 0 while the others skip what they folded already.

Folds feed each other through the log: what one derives in a pass (an alert) is read by
the folds that take it (the run controller) in the next pass of the same
:meth:`EmbeddedHost.run_once`.

Stopping: with :attr:`EmbeddedHost.stop` set (``run_forever`` sets it to its own event),
a pass ends after the batch it is folding is committed, so a stop request (SIGTERM) is
obeyed within one batch (``batch_records``) however long the backlog; the next run goes on
from the committed positions. (Before 2026-11-28 a pass drained the whole backlog first: a
tenant's flood kept ``runwatch process`` deaf to SIGTERM for minutes, review finding 2.)

Time: the folds never read a clock. The host reads one for its liveness only:
:attr:`EmbeddedHost.progress_ts` (wall clock of the last committed batch, or of the last
pass that found the log read to its end), which ``runwatch process --metrics-port`` exports
with the lag (:mod:`runwatch.hosting.progress`) so a stalled or dead host is seen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.fold import Fold
from events.log.base import Record
from events.log.embedded import EmbeddedLog
from events.topics import DEAD_LETTER_TOPIC
from runwatch.hosting.host import Host
from runwatch.hosting.stores import StateFiles
from runwatch.hosting.tenancy import failed_fold

DEAD_LETTER_GROUP = "runwatch-dead-letters"


def letter_stream(letter: DeadLetter) -> str:
    """The dead-letter stream ``letter`` belongs to: the key of its high-water mark in the
    ``runwatch-dead-letters`` group (the written letters' ``source_offset + 1``).

    A record has at most one letter of its own (it did not decode, or its run is another
    tenant's: every fold refused it together) and one ``fold_failed`` letter per fold that
    raised on it. Records are read in offset order per topic, so within one stream the
    offsets only grow: a letter below its stream's mark was written already (a batch re-run
    after a crash between the letters' commit and the folds' checkpoint), one at or above
    it was not. The record's own letters keep the topic as their stream (the key this
    group has always had); a fold's letters get ``"<topic>#fold_failed#<fold>"``, so two
    folds failing on one record write two letters, and a fold added later writes its
    failures on records the other folds passed long ago (review finding: both were dropped,
    while the faust host sends one letter per fold). The fold is named by the letter's
    reason (:func:`~runwatch.hosting.tenancy.failed_fold`)."""
    topic = str(letter.source_topic)
    if letter.source_partition not in (None, 0):  # the embedded log has one partition
        topic = f"{topic}#{letter.source_partition}"
    if letter.kind != "fold_failed":
        return topic
    return f"{topic}#fold_failed#{failed_fold(letter)}"


@dataclass
class HostStats:
    records: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    derived: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "duplicates": self.duplicates,
            "dead_letters": self.dead_letters,
            "derived": dict(self.derived),
        }


def chunks(records: Iterator[Record], n: int) -> Iterator[list[Record]]:
    while chunk := list(islice(records, n)):
        yield chunk


class EmbeddedHost:
    def __init__(
        self, log: EmbeddedLog, folds: Sequence[Fold[Any]], *, batch_records: int = 5000
    ) -> None:
        self.log = log
        self.folds = list(folds)
        self.batch_records = batch_records
        self.stats = HostStats()
        self.host = Host(self.folds, StateFiles(log))
        self._dl_positions = log.load_positions(DEAD_LETTER_GROUP)
        #: when set, :meth:`run_once` returns after the batch it is in is committed (a
        #: caller that stops on a signal sets it here: ``host.stop = its_event``)
        self.stop: threading.Event | None = None
        #: wall clock of the last progress: a batch committed, or a pass that found nothing
        #: new (caught up). None until the first. Read by the metrics, never by a fold.
        self.progress_ts: float | None = None

    def _stopping(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def run_once(self, max_passes: int = 8) -> HostStats:
        """Process everything appended so far; repeat while folds fed each other."""
        for _ in range(max_passes):
            if not self._drain() or self._stopping():
                break
        return self.stats

    def run_forever(self, stop: threading.Event, poll_s: float = 0.2) -> HostStats:
        self.stop = stop
        while not stop.is_set():
            self.run_once()
            stop.wait(poll_s)
        return self.stats

    def _drain(self) -> int:
        host = self.host
        # a stored position past the log's end fails loudly (PositionBeyondEnd), never
        # skips the records appended at the offsets it passed
        host.check_ends({(t, 0): self.log.end_offset_sync(t) for t in host.folds.topics})
        starts = {topic: n for (topic, _), n in host.positions.items()}
        for topic in host.folds.topics:
            starts.setdefault(topic, 0)
        records = self.log.iter_records(list(host.folds.topics), starts)
        seen = 0
        for chunk in chunks(records, self.batch_records):
            seen += len(chunk)
            derived = host.process(chunk)
            self._commit(derived)
            if self._stopping():
                break
        self.stats.records += seen
        self.stats.duplicates = host.duplicates
        if not seen:
            self.progress_ts = time.time()  # read to the end: caught up as of now
        return seen

    def _commit(self, derived: list[EventBase]) -> None:
        host, dl = self.host, self._dl_positions
        dead: list[DeadLetter] = []
        for letter in host.dead_letters:
            stream, offset = letter_stream(letter), letter.source_offset
            if offset is None:  # not located (no record position): nothing to compare
                dead.append(letter)
            elif offset >= dl.get(stream, 0):
                dead.append(letter)
                dl[stream] = offset + 1
        host.dead_letters.clear()
        if dead:
            self.log.append_many_sync(DEAD_LETTER_TOPIC, [(None, d.encode()) for d in dead])
            self.log.commit_positions(DEAD_LETTER_GROUP, dl)
            self.stats.dead_letters += len(dead)
        if derived:
            self.log.append_events_sync(derived)
            for ev in derived:
                self.stats.derived[ev.type] = self.stats.derived.get(ev.type, 0) + 1
        host.checkpoint()
        self.progress_ts = time.time()
