"""Where the trajectory view keeps the payloads of groups not yet delivered.

A view backend behind one small ABC (eventsourcing's view idea): :class:`MemoryPayloads`
for tests, :class:`SpillPayloads` for servers — payload bytes appended to local segment
files and read back with ``pread``, so a queue of thousands of 8 x 512-token groups costs
an index entry each in memory, not the group. The files are a cache of the log, not a
source of truth: a restarted server rebuilds them by folding the log again, so nothing is
fsync'd. A segment is deleted once every payload in it is gone.
"""

from __future__ import annotations

import abc
import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


class PayloadStore(abc.ABC):
    @abc.abstractmethod
    def put(self, group_id: str, payload: bytes) -> None: ...

    @abc.abstractmethod
    def get(self, group_id: str) -> bytes:
        """The payload; KeyError if unknown."""

    @abc.abstractmethod
    def drop(self, group_ids: Iterable[str]) -> None:
        """Forget these payloads (unknown ids are ignored)."""

    @abc.abstractmethod
    def clear(self) -> None: ...

    @abc.abstractmethod
    def __len__(self) -> int: ...

    def close(self) -> None:
        return None


class MemoryPayloads(PayloadStore):
    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}

    def put(self, group_id: str, payload: bytes) -> None:
        self._data[group_id] = payload

    def get(self, group_id: str) -> bytes:
        return self._data[group_id]

    def drop(self, group_ids: Iterable[str]) -> None:
        for gid in group_ids:
            self._data.pop(gid, None)

    def clear(self) -> None:
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


class SpillPayloads(PayloadStore):
    """Payloads in append-only local segment files of about ``segment_bytes`` each."""

    def __init__(
        self, directory: str | os.PathLike[str] | None = None, segment_bytes: int = 256 << 20
    ):
        self._owned = directory is None
        self.dir = Path(directory or tempfile.mkdtemp(prefix="runwatch-payloads-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self._index: dict[str, tuple[int, int, int]] = {}  # id -> (segment, offset, length)
        self._live: dict[int, int] = {}  # segment -> live payloads
        self._fds: dict[int, int] = {}
        self._active = -1
        self._size = 0
        self._roll()

    def _path(self, segment: int) -> Path:
        return self.dir / f"{segment:08d}.payloads"

    def _roll(self) -> None:
        old = self._active
        self._active += 1
        path = self._path(self._active)
        self._fds[self._active] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._live[self._active] = 0
        self._size = 0
        if old >= 0 and self._live.get(old) == 0:
            self._delete(old)

    def _delete(self, segment: int) -> None:
        os.close(self._fds.pop(segment))
        self._live.pop(segment, None)
        self._path(segment).unlink(missing_ok=True)

    def put(self, group_id: str, payload: bytes) -> None:
        if group_id in self._index:
            return
        if self._size >= self.segment_bytes:
            self._roll()
        fd = self._fds[self._active]
        os.pwrite(fd, payload, self._size)
        self._index[group_id] = (self._active, self._size, len(payload))
        self._live[self._active] += 1
        self._size += len(payload)

    def get(self, group_id: str) -> bytes:
        segment, offset, length = self._index[group_id]
        return os.pread(self._fds[segment], length, offset)

    def drop(self, group_ids: Iterable[str]) -> None:
        for gid in group_ids:
            where = self._index.pop(gid, None)
            if where is None:
                continue
            segment = where[0]
            self._live[segment] -= 1
            if self._live[segment] == 0 and segment != self._active:
                self._delete(segment)

    def clear(self) -> None:
        for segment in list(self._fds):
            self._delete(segment)
        self._index.clear()
        self._active = -1
        self._roll()

    def __len__(self) -> int:
        return len(self._index)

    def close(self) -> None:
        for segment in list(self._fds):
            self._delete(segment)
        if self._owned:
            with contextlib.suppress(OSError):
                self.dir.rmdir()
