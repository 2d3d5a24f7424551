"""Where the trajectory view keeps the payloads of groups not yet delivered.

A view backend behind one small ABC (eventsourcing's view idea): :class:`MemoryPayloads`
for tests, :class:`SpillPayloads` for servers — payload bytes appended to local segment
files and read back with ``pread``, so a queue of thousands of 8 x 512-token groups costs
an index entry each in memory, not the group. The files are a cache of the log, not a
source of truth: a restarted server rebuilds them by folding the log again, so nothing is
fsync'd. A segment is deleted once every payload in it is gone.

A server that snapshots its view keeps the files (``keep_files``) and saves the index
with the snapshot (:meth:`SpillPayloads.dump_index`); on restart :meth:`load_index`
reopens the segments it names. Entries whose segment is gone (every payload in it was
dropped after the snapshot) are forgotten; the replay after the snapshot drops them again.
Each entry carries a CRC32, checked on read, so bytes lost to an OS crash are found.

:meth:`PayloadStore.put_many` may be called from a worker thread (a server writes a
request's payloads there while the log acknowledges them); the stores are thread-safe.
"""

from __future__ import annotations

import abc
import contextlib
import os
import tempfile
import threading
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path


class PayloadStore(abc.ABC):
    @abc.abstractmethod
    def put(self, group_id: str, payload: bytes, crc: int | None = None) -> None:
        """Keep ``payload``; ``crc`` is its zlib CRC-32 when the caller has it already."""

    def put_many(self, items: Sequence[tuple[str, bytes, int | None]]) -> None:
        """:meth:`put` each (group id, payload, crc); safe to call from another thread."""
        for group_id, payload, crc in items:
            self.put(group_id, payload, crc)

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

    @abc.abstractmethod
    def __contains__(self, group_id: object) -> bool: ...

    def close(self) -> None:
        return None

    def dump_index(self) -> dict[str, object] | None:
        """A JSON-able index to resume from (None: this store cannot resume)."""
        return None

    def load_index(self, index: dict[str, object]) -> None:
        """Resume from :meth:`dump_index`'s output; a store whose ``dump_index`` returns
        None keeps no index, and callers must not ask it to resume."""
        raise TypeError(f"{type(self).__name__} keeps no index to resume from")


class CorruptPayload(KeyError):
    """A payload's bytes do not match the checksum stored with its index entry."""


class MemoryPayloads(PayloadStore):
    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}

    def put(self, group_id: str, payload: bytes, crc: int | None = None) -> None:
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

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._data


class SpillPayloads(PayloadStore):
    """Payloads in append-only local segment files of about ``segment_bytes`` each."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        segment_bytes: int = 256 << 20,
        keep_files: bool = False,
    ):
        self._owned = directory is None
        self.dir = Path(directory or tempfile.mkdtemp(prefix="runwatch-payloads-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.keep_files = keep_files
        # id -> (segment, offset, length, crc32)
        self._index: dict[str, tuple[int, int, int, int]] = {}
        self._live: dict[int, int] = {}  # segment -> live payloads
        self._fds: dict[int, int] = {}
        # put_many runs on a writer thread: the index, the files and their descriptors
        # change under this lock only, taken per payload (so the event loop, which also
        # takes it, never waits for more than one write)
        self._lock = threading.Lock()
        self._active = max(self._on_disk(), default=-1)
        self._size = 0
        self._roll()

    def _on_disk(self) -> list[int]:
        return [int(p.stem) for p in self.dir.glob("*.payloads") if p.stem.isdigit()]

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
        fd = self._fds.pop(segment, None)
        if fd is not None:
            os.close(fd)
        self._live.pop(segment, None)
        self._path(segment).unlink(missing_ok=True)

    def put(self, group_id: str, payload: bytes, crc: int | None = None) -> None:
        with self._lock:
            if group_id in self._index:
                return
            if self._size >= self.segment_bytes:
                self._roll()
            fd = self._fds[self._active]
            os.pwrite(fd, payload, self._size)
            if crc is None:
                crc = zlib.crc32(payload)
            self._index[group_id] = (self._active, self._size, len(payload), crc)
            self._live[self._active] += 1
            self._size += len(payload)

    def get(self, group_id: str) -> bytes:
        with self._lock:
            segment, offset, length, crc = self._index[group_id]
            data = os.pread(self._fds[segment], length, offset)
        if zlib.crc32(data) != crc:
            raise CorruptPayload(group_id)
        return data

    def drop(self, group_ids: Iterable[str]) -> None:
        with self._lock:
            for gid in group_ids:
                where = self._index.pop(gid, None)
                if where is None or where[0] not in self._live:  # unknown, or closed
                    continue
                segment = where[0]
                self._live[segment] -= 1
                if self._live[segment] == 0 and segment != self._active:
                    self._delete(segment)

    def clear(self) -> None:
        with self._lock:
            for segment in list(self._fds):
                self._delete(segment)
            self._index.clear()
            self._roll()

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._index

    def dump_index(self) -> dict[str, object] | None:
        if not self.keep_files:
            return None
        with self._lock:
            return {"entries": dict(self._index)}  # a copy: encoded on another thread

    def load_index(self, index: dict[str, object]) -> None:
        """Adopt the entries of a saved index whose bytes are still on disk."""
        with self._lock:
            self._load_index(index)

    def _load_index(self, index: dict[str, object]) -> None:
        entries: dict[str, list[int]] = index["entries"]  # type: ignore[assignment]
        sizes: dict[int, int] = {}
        for gid, (segment, offset, length, crc) in entries.items():
            if segment not in sizes:
                path = self._path(segment)
                sizes[segment] = path.stat().st_size if path.exists() else -1
                if sizes[segment] >= 0 and segment not in self._fds:
                    self._fds[segment] = os.open(path, os.O_RDWR)
                    self._live.setdefault(segment, 0)
            if sizes[segment] >= offset + length:
                self._index[gid] = (segment, offset, length, crc)
                self._live[segment] += 1
        for segment in self._on_disk():  # files no entry needs any more
            if segment != self._active and not self._live.get(segment):
                self._delete(segment)

    def close(self) -> None:
        with self._lock:
            for segment in list(self._fds):
                if self.keep_files:
                    os.close(self._fds.pop(segment))
                else:
                    self._delete(segment)
            self._index.clear()
            self._live.clear()
        if self._owned:
            with contextlib.suppress(OSError):
                self.dir.rmdir()
