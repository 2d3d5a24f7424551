"""Records faust skipped after a seek: the hole found, the records fetched again, in order.

faust-streaming 0.15 loses records around a worker restart (``docs/recovery.md``, traced
by ``benchmarks/worker_recovery.py --trace-offsets``): it resumes fetching before its seek
to the committed offsets, clears the agent's queue when the seek is done, and the next
record fetched then lies past the cleared ones; its drain loop records the jump as a
*gap* — offsets it counts as acknowledged, meant for compacted topics and transaction
markers — and the next commit moves past records nobody folded.

runwatch's input topics are neither compacted nor written in transactions (idempotent
producers write no markers), so on them every record between two offsets exists and a
jump is always this race. For an app opted in with :func:`enable`, on its agents' input
topics, records are filtered where faust's drain loop takes them from the fetcher
(``Consumer.getmany``), before they reach a stream or move faust's read offset:

- a record more than one past faust's read offset opens a **hole** at that read offset
  (after a seek it is the committed offset, a record not yet read; otherwise the last
  record read, fetched once more and recognised by its event id in the slots) and the
  partition is sought back to it (``Consumer.seek_wait``); the record is dropped;
- while the hole is open, records past it are dropped (those faust had already fetched;
  they come again after the hole's record), with another seek at most every
  ``reseek_s`` while they keep coming; the hole's own record closes it, and the agent
  folds it and everything after it in offset order;
- faust's commit is checked too (``Consumer._new_offset``): a record delivered and then
  dropped by faust at the committed offset itself, with later ones acknowledged (faust
  0.15 commits past one such record), opens a hole there instead of a commit;
- records that are not on the log after all never stall a partition: a hole whose record
  does not come back after ``max_seeks`` seeks, the log's start now past it (deleted by
  retention), is recorded as faust's own gap up to the log's start, logged as an error
  with its partition and offsets, and the hole moves to the log's start (records fetched
  meanwhile are not skipped: they are fetched again from there); the same jump seen again
  right after its hole was filled (offsets absent: compaction or transaction markers,
  which runwatch's topics do not have) is let through as faust's gap, logged.

faust's drain loop then never sees an unexplained jump on these topics; should one reach
it anyway, the wrapped ``Consumer._add_gap`` opens a hole instead of recording a gap, so
faust (which commits only consecutive acknowledged offsets) cannot commit past it. Seeks
go through ``Consumer.seek_wait``: on the consumer's thread, as faust's own seeks.

Limits: a partition with no committed offset yet (a group that never committed) has no
read offset after the seek and no committed offset to check, so nothing is judged there;
a hole is sought when a record past it arrives, so on a partition that falls quiet a
dropped record waits (uncommitted, not lost) for the next one.

Time: :meth:`Holes.fetched` takes the caller's monotonic clock reading; nothing here reads
a clock but the wrapped ``getmany``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

log = logging.getLogger(__name__)

#: the faust ``App`` attribute that opts an app in: input topic -> the ``Holes`` watching
#: it (one per agent), read by the wrapped consumer methods
APP_ATTR = "runwatch_holes"


class Verdict(Enum):
    PASS = "pass"  # on to faust's drain loop and the agent
    DROP = "drop"  # past a hole; a seek back to it was asked for recently
    SEEK = "seek"  # past a hole: seek the partition back to it, and drop the record
    GAP = "gap"  # on, past offsets not on the log: faust records them as its gap
    RELEASE = "release"  # past a hole that never came back: resume at the log's start


@dataclass
class Hole:
    offset: int
    #: the record that showed the hole (the jump's target)
    jump_to: int
    seeks: int = 0
    last_seek: float = float("-inf")
    dropped: int = 0


@dataclass
class Holes:
    """The open holes of one agent's input partitions, by (topic, partition)."""

    topics: frozenset[str]
    reseek_s: float = 0.5
    max_seeks: int = 20
    open_holes: dict[tuple[str, int], Hole] = field(default_factory=dict)
    #: the last hole filled per partition, (start, jump target), until a record follows
    #: its start in order: the same jump again right after it means offsets not on the log
    refilled: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    #: jump targets let through as faust's own gap, per partition (see ``gap_accepted``)
    accepted: dict[tuple[str, int], int] = field(default_factory=dict)
    #: per partition, the offset below which records were given up (see ``release``)
    gone_below: dict[tuple[str, int], int] = field(default_factory=dict)
    #: holes closed by their record, holes given up (their records lost), jumps over
    #: offsets not on the log
    filled: int = 0
    given_up: int = 0
    absent: int = 0

    def open(self, topic: str, partition: int, offset: int, jump_to: int) -> None:
        """Records of the partition from ``offset`` on were skipped, as the record at
        ``jump_to`` showed (an open hole keeps the lower start)."""
        key = (topic, partition)
        hole = self.open_holes.get(key)
        if hole is None:
            self.open_holes[key] = Hole(offset, jump_to)
            log.warning("faust skipped records of %s[%d] from offset %d: fetching them again",
                        topic, partition, offset)  # fmt: skip
        elif offset < hole.offset:
            hole.offset = offset

    def fetched(
        self, topic: str, partition: int, offset: int, read_offset: int | None, now: float
    ) -> Verdict:
        """What becomes of the record at ``offset`` that faust fetched, its read offset
        of the partition being ``read_offset``."""
        key = (topic, partition)
        hole = self.open_holes.get(key)
        if hole is None:
            if read_offset is None or offset <= read_offset + 1:
                if self.refilled:
                    self.refilled.pop(key, None)
                return Verdict.PASS
            if self.refilled.pop(key, None) == (read_offset, offset):
                self.absent += 1
                self.accepted[key] = offset
                log.warning("offsets %d..%d of %s[%d] are not on the log (compacted, "
                            "transaction markers, deleted): going on from %d", read_offset + 1,
                            offset - 1, topic, partition, offset)  # fmt: skip
                return Verdict.GAP
            self.open(topic, partition, read_offset, offset)
            hole = self.open_holes[key]
        if offset < hole.offset:
            return Verdict.PASS
        if offset == hole.offset:
            del self.open_holes[key]
            self.filled += 1
            self.refilled[key] = (hole.offset, hole.jump_to)
            log.warning("records of %s[%d] from offset %d fetched again after %d seek(s), "
                        "%d fetched past them dropped meanwhile", topic, partition, offset,
                        hole.seeks, hole.dropped)  # fmt: skip
            return Verdict.PASS
        hole.dropped += 1
        if hole.seeks >= self.max_seeks:
            hole.seeks = 0
            return Verdict.RELEASE
        if now - hole.last_seek < self.reseek_s:
            return Verdict.DROP
        hole.seeks += 1
        hole.last_seek = now
        return Verdict.SEEK

    def hole_at(self, topic: str, partition: int) -> int:
        return self.open_holes[(topic, partition)].offset

    def release(self, topic: str, partition: int, offset: int, log_start: int) -> int | None:
        """The hole's record did not come back after ``max_seeks`` seeks (``offset``: the
        record at hand) and the log now starts at ``log_start``. Returns the hole's start
        when its records were deleted (the hole moves to ``log_start``, to be sought); None
        when they should still be there but do not come (the hole is closed and the
        record at hand let through as faust's gap: going on beats a partition stalled for
        good)."""
        key = (topic, partition)
        hole = self.open_holes[key]
        self.given_up += 1
        if log_start > hole.offset:
            log.error("records of %s[%d] from offset %d to %d were deleted before they were "
                      "folded (retention): going on from the log's start, %d", topic,
                      partition, hole.offset, log_start - 1, log_start)  # fmt: skip
            start, hole.offset, hole.last_seek = hole.offset, log_start, float("-inf")
            self.gone_below[key] = log_start
            return start
        del self.open_holes[key]
        self.accepted[key] = offset
        self.gone_below[key] = offset
        log.error("records of %s[%d] from offset %d to %d did not come back after %d seeks "
                  "(the log starts at %d): going on without them", topic, partition,
                  hole.offset, offset - 1, self.max_seeks, log_start)  # fmt: skip
        return None

    def head_missing(self, topic: str, partition: int, committed: int, first_acked: int) -> bool:
        """faust is about to commit while the record at ``committed`` (the next to commit)
        was never acknowledged and later ones were: it was delivered and then dropped by
        faust (faust 0.15 would commit past a single one). Opens a hole there (the commit
        waits, the record is fetched again) and says so; not for a record given up
        (:meth:`release`: faust may not be able to record it as a gap)."""
        key = (topic, partition)
        if committed < self.gone_below.get(key, -1):
            return False
        self.open(topic, partition, committed, first_acked)
        return True

    def gap_accepted(self, topic: str, partition: int, offset_to: int) -> bool:
        """Whether faust's drain loop may record its gap up to ``offset_to``: only for a
        jump :meth:`fetched` let through as :attr:`Verdict.GAP`."""
        key = (topic, partition)
        if self.accepted.get(key) != offset_to:
            return False
        del self.accepted[key]
        return True

    def revoke(self, partitions: set[tuple[str, int]]) -> None:
        """Partitions this worker no longer owns: their holes are another worker's."""
        for key in partitions:
            for held in (self.open_holes, self.refilled, self.accepted, self.gone_below):
                held.pop(key, None)


def enable(app: Any, holes: Holes) -> None:
    """Opt ``app`` in for ``holes.topics``; revoked partitions drop their holes."""
    _patch_faust()
    watched: dict[str, Holes] = getattr(app, APP_ATTR, None) or {}
    watched.update(dict.fromkeys(holes.topics, holes))
    setattr(app, APP_ATTR, watched)

    @app.on_partitions_revoked.connect
    async def _drop_revoked(sender: Any, revoked: Any = (), **_: Any) -> None:
        holes.revoke({(tp.topic, tp.partition) for tp in revoked})


def _watched(consumer: Any) -> dict[str, Holes]:
    """The consumer's app's watched topics (empty: the app did not opt in)."""
    return getattr(consumer.app, APP_ATTR, None) or {}


_patched = False
#: what the guard wraps or calls on faust 0.15's ``Consumer``
HOOKS = ("getmany", "_add_gap", "_new_offset", "seek_wait", "earliest_offsets")


def _patch_faust() -> None:
    """Wrap faust 0.15's ``Consumer.getmany``, ``_add_gap`` and ``_new_offset`` (once per
    process); apps and topics not opted in keep faust's behaviour."""
    global _patched
    if _patched:
        return
    from faust.transport.consumer import Consumer

    missing = [name for name in HOOKS if not hasattr(Consumer, name)]
    if missing:  # another faust than 0.15: its internals moved; say so, change nothing
        log.error("faust's Consumer lacks %s: the guard against records lost around a "
                  "restart is off (docs/recovery.md)", ", ".join(missing))  # fmt: skip
        return

    getmany = Consumer.getmany
    add_gap = Consumer._add_gap
    new_offset = Consumer._new_offset

    async def _getmany(self: Any, timeout: float) -> AsyncIterator[tuple[Any, Any]]:
        watched = _watched(self)
        read_offset = self._read_offset
        async for tp, message in getmany(self, timeout):
            holes = watched.get(tp.topic)
            if holes is not None:
                verdict = holes.fetched(
                    tp.topic, tp.partition, message.offset, read_offset.get(tp), time.monotonic()
                )
                if verdict is Verdict.RELEASE or verdict is Verdict.SEEK:
                    try:  # False: the hole was let go, the record goes on as faust's gap
                        held = await _seek_hole(self, holes, tp, message.offset, verdict)
                    except Exception as exc:  # revoked meanwhile, the broker away: the
                        # next record past the hole tries again
                        log.warning("seek of %s to its hole failed: %r", tp, exc)
                        held = True
                    if held:
                        continue
                elif verdict is Verdict.DROP:
                    continue
            yield tp, message

    async def _seek_hole(self: Any, holes: Holes, tp: Any, offset: int, verdict: Verdict) -> bool:
        """Seek ``tp`` back to its hole (on the consumer's thread, as faust's own seeks);
        for RELEASE, first move the hole past deleted records. False when the hole was
        let go instead (the record at ``offset`` goes on)."""
        key = (tp.topic, tp.partition)
        if verdict is Verdict.RELEASE:
            log_start = (await self.earliest_offsets(tp))[tp]
            if key not in holes.open_holes:  # revoked during the round trip
                return True
            gone = holes.release(tp.topic, tp.partition, offset, log_start)
            if gone is None:
                return False
            await add_gap(self, tp, gone, log_start - 1)  # faust's own gap: deleted records
        if key in holes.open_holes:
            await self.seek_wait({tp: holes.hole_at(tp.topic, tp.partition)})
        return True

    async def _add_gap(self: Any, tp: Any, offset_from: int, offset_to: int) -> None:
        holes = _watched(self).get(tp.topic)
        if holes is not None and not holes.gap_accepted(tp.topic, tp.partition, offset_to):
            # (offset_from is faust's read offset + 1)
            holes.open(tp.topic, tp.partition, offset_from - 1, offset_to)
            return
        await add_gap(self, tp, offset_from, offset_to)

    def _new_offset(self: Any, tp: Any) -> int | None:
        holes = _watched(self).get(tp.topic)
        acked, committed = self._acked[tp], self._committed_offset[tp]
        if holes is not None and acked and committed is not None and not self._gap.get(tp):
            first = min(acked)  # above committed: the record there was dropped
            if first > committed and holes.head_missing(tp.topic, tp.partition, committed, first):
                return None
        return new_offset(self, tp)

    Consumer.getmany = _getmany  # type: ignore[method-assign]
    Consumer._add_gap = _add_gap  # type: ignore[method-assign]
    Consumer._new_offset = _new_offset  # type: ignore[method-assign]
    _patched = True
