"""What the batching fold remembers of accepted pushes: an immutable map with a window.

A retried push must not be stored twice (issue 19). Every keyed group carries its push's
identity on the log (``ScoredDataGroupStored.idempotency_key`` and ``key_index``, or the
``content_digest`` of a server that dedupes by content), and the fold keeps, per
identity, a :class:`PushRecord`. The fold is pure, so the map is immutable: an update
returns a new map and shares everything it did not touch.

Layout: a two-level radix over the key's hash (64 x 64 slots, each a small dict), so a
put copies two 64-tuples and one leaf dict (about 25 entries at 100,000 keys) instead of
the whole map. Expiry is kept in a persistent FIFO (two cons lists, Okasaki's queue) of
keys in the order they were first recorded.

Window, in accepted groups (the fold's ``arrivals``), never wall-clock: a record made
when the fold had accepted ``a`` groups, under window ``w``, is forgotten once it has
accepted ``a + w``. Each event carries the window of the server that accepted it (so
every folder of the partition forgets at the same place). Records leave the map in the
order they came, so one made under a longer window holds later ones in memory until it
expires; :func:`live` treats those as forgotten all the same.

The hash layout depends on the process (Python's string hash is salted); nothing of it
is persisted: :meth:`PushKeys.dump` lists the records in FIFO order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, NamedTuple

from events.catalog.trajectory import ScoredDataGroupStored

_FAN = 64
_MASK = _FAN - 1
_EMPTY_ROOT: tuple[Any, ...] = (None,) * _FAN

#: ``PushRecord.crcs`` entry of an index of the push that never reached the log.
MISSING = -1


class PushRecord(NamedTuple):
    """One push identity as folded: when it is forgotten, the payload CRC-32 of each of
    its groups by index (:data:`MISSING` for those not stored yet: a push that reached
    the log in part), and what the push's answer said of buffered groups."""

    expires: int
    crcs: tuple[int, ...]
    buffered: int = 0
    last_buffer: int = -1

    def has(self, index: int) -> bool:
        return index < len(self.crcs) and self.crcs[index] != MISSING

    def with_crc(self, index: int, crc: int) -> PushRecord:
        crcs = self.crcs + (MISSING,) * (index + 1 - len(self.crcs))
        return self._replace(crcs=(*crcs[:index], crc, *crcs[index + 1 :]))


class PushKeys:
    """Immutable ``str -> PushRecord`` map that forgets in first-recorded order."""

    __slots__ = ("_back", "_front", "_len", "_root")

    _root: tuple[Any, ...]
    _front: Any  # (key, rest) cons list, oldest first, or None
    _back: Any  # (key, rest) cons list, newest first, or None
    _len: int

    def __init__(self) -> None:
        self._root, self._front, self._back, self._len = _EMPTY_ROOT, None, None, 0

    @classmethod
    def _of(cls, root: tuple[Any, ...], front: Any, back: Any, length: int) -> PushKeys:
        keys = cls.__new__(cls)
        keys._root, keys._front, keys._back, keys._len = root, front, back, length
        return keys

    def __len__(self) -> int:
        return self._len

    def __eq__(self, other: object) -> bool:
        """Equal records in the same FIFO order (the layout is not compared)."""
        if not isinstance(other, PushKeys):
            return NotImplemented
        return self is other or (self._len == other._len and list(self) == list(other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PushKeys({len(self)} keys)"

    def get(self, key: str) -> PushRecord | None:
        h = hash(key)
        mid = self._root[h & _MASK]
        if mid is None:
            return None
        leaf = mid[(h >> 6) & _MASK]
        return None if leaf is None else leaf.get(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def put(self, key: str, record: PushRecord) -> PushKeys:
        """A map with ``key`` set to ``record`` (a new key joins the FIFO's end)."""
        root, new = _set(self._root, key, record)
        if not new:
            return PushKeys._of(root, self._front, self._back, self._len)
        return PushKeys._of(root, self._front, (key, self._back), self._len + 1)

    def expire(self, arrivals: int) -> PushKeys:
        """This map without the oldest records whose window ended at ``arrivals``."""
        keys = self
        while keys._len:
            front, back = keys._front, keys._back
            if front is None:
                front, back = _reversed(back), None
            key, rest = front
            record = keys.get(key)
            if record is not None and record.expires > arrivals:
                if front is not keys._front:  # keep the reversal done for the peek
                    keys = PushKeys._of(keys._root, front, back, keys._len)
                return keys
            root = _delete(keys._root, key) if record is not None else keys._root
            keys = PushKeys._of(root, rest, back, keys._len - 1)
        return keys

    def __iter__(self) -> Iterator[tuple[str, PushRecord]]:
        """(key, record) in FIFO order (oldest first)."""
        node = self._front
        while node is not None:
            key, node = node
            record = self.get(key)
            if record is not None:
                yield key, record
        newest_first = []
        node = self._back
        while node is not None:
            key, node = node
            newest_first.append(key)
        for key in reversed(newest_first):
            record = self.get(key)
            if record is not None:
                yield key, record

    # -- persistence (snapshots) ------------------------------------------------------------
    def dump(self) -> list[list[Any]]:
        return [[k, r.expires, list(r.crcs), r.buffered, r.last_buffer] for k, r in self]

    @classmethod
    def load(cls, rows: list[list[Any]]) -> PushKeys:
        keys = cls()
        for key, expires, crcs, buffered, last_buffer in rows:
            keys = keys.put(key, PushRecord(expires, tuple(crcs), buffered, last_buffer))
        return keys


def _set(root: tuple[Any, ...], key: str, record: PushRecord) -> tuple[tuple[Any, ...], bool]:
    h = hash(key)
    i, j = h & _MASK, (h >> 6) & _MASK
    mid = root[i] or _EMPTY_ROOT
    leaf = dict(mid[j] or ())
    new = key not in leaf
    leaf[key] = record
    mid = (*mid[:j], leaf, *mid[j + 1 :])
    return (*root[:i], mid, *root[i + 1 :]), new


def _delete(root: tuple[Any, ...], key: str) -> tuple[Any, ...]:
    h = hash(key)
    i, j = h & _MASK, (h >> 6) & _MASK
    mid = root[i]
    leaf = dict(mid[j])
    del leaf[key]
    mid = (*mid[:j], leaf or None, *mid[j + 1 :])
    return (*root[:i], mid, *root[i + 1 :])


def _reversed(node: Any) -> Any:
    out = None
    while node is not None:
        item, node = node
        out = (item, out)
    return out


EMPTY_KEYS = PushKeys()

By = Literal["idempotency_key", "content"]


def idempotency_slot(key: str) -> str:
    """The map key of a push's ``Idempotency-Key``."""
    return f"k:{key}"


def content_slot(digest: str) -> str:
    """The map key of a payload digest."""
    return f"c:{digest}"


def screen(keys: PushKeys, arrivals: int, ev: ScoredDataGroupStored) -> tuple[PushKeys, By | None]:
    """Check a group's identity against ``keys`` (after forgetting what expired at
    ``arrivals``): why it is a repeat, or None and the map with it recorded."""
    keys = keys.expire(arrivals)
    key = idempotency_slot(ev.idempotency_key) if ev.idempotency_key else None
    digest = content_slot(ev.content_digest) if ev.content_digest else None
    rec = live(keys, key, arrivals) if key is not None else None
    if rec is not None and rec.has(ev.key_index):
        return keys, "idempotency_key"
    if digest is not None and live(keys, digest, arrivals) is not None:
        return keys, "content"
    expires = arrivals + max(1, ev.dedupe_window)
    if key is not None:
        rec = rec if rec is not None else PushRecord(expires, ())
        keys = keys.put(key, rec.with_crc(ev.key_index, ev.payload_crc))
    if digest is not None:
        keys = keys.put(digest, PushRecord(expires, (ev.payload_crc,)))
    return keys, None


def live(keys: PushKeys, slot: str, arrivals: int) -> PushRecord | None:
    """The record at ``slot`` if its window has not ended at ``arrivals`` (one held in
    the map behind a longer-lived record is already forgotten)."""
    rec = keys.get(slot)
    return rec if rec is not None and rec.expires > arrivals else None


def note_buffered(keys: PushKeys, key: str, buffer_sequences: int) -> PushKeys:
    """Record that a group of push ``key`` was buffered (its answer says so)."""
    slot = idempotency_slot(key)
    rec = keys.get(slot)
    if rec is None:
        return keys
    rec = rec._replace(buffered=rec.buffered + 1, last_buffer=buffer_sequences)
    return keys.put(slot, rec)
