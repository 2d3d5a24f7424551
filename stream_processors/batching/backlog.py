"""The batching fold's queue: groups in arrival order, immutable, stored in chunks.

The fold is pure: ``apply`` returns a new state and never changes the old one. With the
queue as one tuple, each accepted group copied the whole queue, so the fold's cost per
group grew with the backlog: 4 us at 600 queued groups, 300 us at 50,000 (the default
queue cap), and pushes slowed down exactly when the trainer fell behind. A
:class:`Backlog` keeps the groups in chunks of at most :data:`CHUNK`:

- appending copies the last chunk and the tuple of chunks: O(CHUNK + n / CHUNK);
- removing a batch's groups (they are near the head) rebuilds only their chunks;
- each chunk carries its oldest trainer step and its sequence count, so a staleness check
  skips the chunks that cannot hold a stale group, and ``sequences`` needs no scan.

Chunks are tuples, shared between states and never changed. Positions are indexes into
the whole queue, as with a tuple; equality is the sequence's.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, overload

from stream_processors.batching.selection import Queued

#: Groups per chunk: an append copies up to this many references plus one per chunk.
CHUNK = 256


class _Chunk(NamedTuple):
    groups: tuple[Queued, ...]
    oldest_step: int
    sequences: int


def _chunk(groups: tuple[Queued, ...]) -> _Chunk:
    return _Chunk(groups, min(g.step for g in groups), sum(g.size for g in groups))


class Backlog(Sequence[Queued]):
    """An immutable sequence of queued groups (arrival order) built for the fold's use."""

    __slots__ = ("_chunks", "_len", "_starts")

    _chunks: tuple[_Chunk, ...]
    _len: int
    _starts: list[int] | None

    def __init__(self, groups: Iterable[Queued] = ()) -> None:
        items = tuple(groups)
        self._set(tuple(_chunk(items[i : i + CHUNK]) for i in range(0, len(items), CHUNK)))

    @classmethod
    def _of(cls, chunks: tuple[_Chunk, ...], length: int | None = None) -> Backlog:
        backlog = cls.__new__(cls)
        backlog._set(chunks, length)
        return backlog

    def _set(self, chunks: tuple[_Chunk, ...], length: int | None = None) -> None:
        self._chunks = chunks  # no empty chunk
        self._len = sum(len(c.groups) for c in chunks) if length is None else length
        self._starts = None  # first position of each chunk, computed when indexed

    # -- the sequence ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Queued]:
        return itertools.chain.from_iterable(c.groups for c in self._chunks)

    def _locate(self, position: int) -> tuple[int, int]:
        """(chunk, index in it) of a position."""
        if self._starts is None:
            self._starts = list(
                itertools.accumulate((len(c.groups) for c in self._chunks), initial=0)
            )
        chunk = bisect.bisect_right(self._starts, position) - 1
        return chunk, position - self._starts[chunk]

    @overload
    def __getitem__(self, index: int) -> Queued: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Queued, ...]: ...

    def __getitem__(self, index: int | slice) -> Queued | tuple[Queued, ...]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            return (
                tuple(itertools.islice(self, start, stop, step))
                if step > 0
                else (tuple(self)[index])
            )
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("backlog index out of range")
        chunk, at = self._locate(index)
        return self._chunks[chunk].groups[at]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Backlog | tuple | list):
            return self._len == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Backlog({list(self)!r})"

    @property
    def sequences(self) -> int:
        """Sequences queued (the sum of the groups' sizes)."""
        return sum(c.sequences for c in self._chunks)

    # -- new backlogs ---------------------------------------------------------------------
    def appended(self, *groups: Queued) -> Backlog:
        """This backlog with ``groups`` after its last group."""
        if not groups:
            return self
        chunks = self._chunks
        length = self._len + len(groups)
        if chunks and len(chunks[-1].groups) < CHUNK:
            last = chunks[-1]
            fill, groups = groups[: CHUNK - len(last.groups)], groups[CHUNK - len(last.groups) :]
            grown = _Chunk(
                last.groups + fill,
                min(last.oldest_step, *(g.step for g in fill)),
                last.sequences + sum(g.size for g in fill),
            )
            chunks = (*chunks[:-1], grown)
        extra = tuple(_chunk(groups[i : i + CHUNK]) for i in range(0, len(groups), CHUNK))
        return Backlog._of(chunks + extra, length)

    def without(self, positions: Iterable[int]) -> Backlog:
        """This backlog less the groups at ``positions`` (distinct, valid positions)."""
        by_chunk: dict[int, set[int]] = {}
        for position in positions:
            chunk, at = self._locate(position)
            by_chunk.setdefault(chunk, set()).add(at)
        if not by_chunk:
            return self
        chunks = []
        for i, c in enumerate(self._chunks):
            gone = by_chunk.get(i)
            if gone is None:
                chunks.append(c)
            elif len(gone) < len(c.groups):
                chunks.append(_chunk(tuple(g for j, g in enumerate(c.groups) if j not in gone)))
        return Backlog._of(tuple(chunks), self._len - sum(map(len, by_chunk.values())))

    def split_off(
        self, is_gone: Callable[[Queued], bool], older_than: int
    ) -> tuple[Backlog, list[Queued]]:
        """(this backlog less the groups ``is_gone`` says go, those groups in order).

        Only groups accepted under a step below ``older_than`` can go: chunks whose
        oldest step is not below it are kept without looking at their groups."""
        chunks: list[_Chunk] = []
        gone: list[Queued] = []
        for c in self._chunks:
            if c.oldest_step >= older_than:
                chunks.append(c)
                continue
            kept: list[Queued] = []
            for g in c.groups:
                (gone if is_gone(g) else kept).append(g)
            if len(kept) == len(c.groups):
                chunks.append(c)
            elif kept:
                chunks.append(_chunk(tuple(kept)))
        return (Backlog._of(tuple(chunks)) if gone else self), gone

    def merged(self, groups: Iterable[Queued]) -> Backlog:
        """This backlog with ``groups`` put back at their arrival places (``order``)."""
        return Backlog(sorted(itertools.chain(self, groups), key=lambda g: g.order))


#: The empty backlog (immutable, so one is enough).
EMPTY = Backlog()
