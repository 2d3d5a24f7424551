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
  partition is sought back to it (``Consumer.seek``); the record is dropped;
- while the hole is open, records past it are dropped (those faust had already fetched;
  they come again after the hole's record), with another seek at most every
  ``reseek_s`` while they keep coming; the hole's own record closes it, and the agent
  folds it and everything after it in offset order;
- a hole whose record does not come back after ``max_seeks`` seeks (deleted by retention
  meanwhile) is given up: logged as an error with its partition and offsets, counted, and
  the record at hand let through.

faust's drain loop then never sees a jump on these topics; should one reach it anyway,
the wrapped ``Consumer._add_gap`` opens a hole instead of recording a gap, so faust (which
commits only consecutive acknowledged offsets) cannot commit past it. Limit: one record
missing just at the committed offset is not a jump (faust's read offset stands on it) and
faust 0.15's commit check lets one missing record at the head through; the trace has not
shown it, and it would need a single record fetched inside the race window.

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


@dataclass
class Hole:
    offset: int
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
    #: holes closed by their record, and holes given up (their records lost)
    filled: int = 0
    given_up: int = 0

    def open(self, topic: str, partition: int, offset: int) -> None:
        """Records of the partition from ``offset`` on were skipped (an open hole keeps
        the lower start)."""
        key = (topic, partition)
        hole = self.open_holes.get(key)
        if hole is None:
            self.open_holes[key] = Hole(offset)
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
                return Verdict.PASS
            self.open(topic, partition, read_offset)
            hole = self.open_holes[key]
        if offset < hole.offset:
            return Verdict.PASS
        if offset == hole.offset:
            del self.open_holes[key]
            self.filled += 1
            log.warning("records of %s[%d] from offset %d fetched again after %d seek(s), "
                        "%d fetched past them dropped meanwhile", topic, partition, offset,
                        hole.seeks, hole.dropped)  # fmt: skip
            return Verdict.PASS
        if hole.seeks >= self.max_seeks:
            del self.open_holes[key]
            self.given_up += 1
            log.error("records of %s[%d] from offset %d to %d did not come back after %d "
                      "seeks (deleted?): going on from %d without them", topic, partition,
                      hole.offset, offset - 1, hole.seeks, offset)  # fmt: skip
            return Verdict.PASS
        hole.dropped += 1
        if now - hole.last_seek < self.reseek_s:
            return Verdict.DROP
        hole.seeks += 1
        hole.last_seek = now
        return Verdict.SEEK

    def hole_at(self, topic: str, partition: int) -> int:
        return self.open_holes[(topic, partition)].offset

    def revoke(self, partitions: set[tuple[str, int]]) -> None:
        """Partitions this worker no longer owns: their holes are another worker's."""
        for key in partitions:
            self.open_holes.pop(key, None)


def enable(app: Any, holes: Holes) -> None:
    """Opt ``app`` in for ``holes.topics``; revoked partitions drop their holes."""
    _patch_faust()
    watched: dict[str, Holes] = getattr(app, APP_ATTR, None) or {}
    watched.update(dict.fromkeys(holes.topics, holes))
    setattr(app, APP_ATTR, watched)

    @app.on_partitions_revoked.connect
    async def _drop_revoked(sender: Any, revoked: Any = (), **_: Any) -> None:
        holes.revoke({(tp.topic, tp.partition) for tp in revoked})


_patched = False


def _patch_faust() -> None:
    """Wrap faust 0.15's ``Consumer.getmany`` and ``Consumer._add_gap`` (once per
    process); apps and topics not opted in keep faust's behaviour."""
    global _patched
    if _patched:
        return
    from faust.transport.consumer import Consumer

    getmany = Consumer.getmany
    add_gap = Consumer._add_gap

    async def _getmany(self: Any, timeout: float) -> AsyncIterator[tuple[Any, Any]]:
        watched: dict[str, Holes] = getattr(self.app, APP_ATTR, None) or {}
        read_offset = self._read_offset
        async for tp, message in getmany(self, timeout):
            holes = watched.get(tp.topic)
            if holes is not None:
                verdict = holes.fetched(
                    tp.topic, tp.partition, message.offset, read_offset.get(tp), time.monotonic()
                )
                if verdict is Verdict.SEEK:
                    await self.seek(tp, holes.hole_at(tp.topic, tp.partition))
                if verdict is not Verdict.PASS:
                    continue
            yield tp, message

    async def _add_gap(self: Any, tp: Any, offset_from: int, offset_to: int) -> None:
        holes = (getattr(self.app, APP_ATTR, None) or {}).get(tp.topic)
        if holes is not None:  # (offset_from is faust's read offset + 1)
            holes.open(tp.topic, tp.partition, offset_from - 1)
            return
        await add_gap(self, tp, offset_from, offset_to)

    Consumer.getmany = _getmany  # type: ignore[method-assign]
    Consumer._add_gap = _add_gap  # type: ignore[method-assign]
    _patched = True
