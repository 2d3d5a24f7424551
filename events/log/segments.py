"""The embedded log's on-disk format: one topic's append-only segment files.

Layout of a topic directory::

    <root>/<topic>/00000000000000000000.seg   records from offset 0
    <root>/<topic>/00000000000000131072.seg   the next segment, named by its base offset
    <root>/<topic>/LOCK                       writers hold an exclusive flock while appending
    <root>/<topic>/quarantine/                bytes cut off a corrupt tail (kept, never read)

One record::

    body_len u32 | crc32 u32 | timestamp_ns i64 | key_len u16 (0xFFFF: no key) | key | value

``body_len`` counts key and value; ``crc32`` covers everything after itself. Offsets
are dense: a record's offset is its segment's base offset plus its index in the segment.

Assumptions and guarantees:

- One append is one ``write`` of whole records under the topic's flock, flushed (and
  fsync'd when ``sync``) before the call returns. A crash can therefore leave only a
  torn *tail*: bytes after the last good record from which no verifying record follows
  (an incomplete record, or a last write whose pages never reached the disk).
  :meth:`TopicLog.recover` (run when a writer opens the topic, and by every append)
  finds the first record that is short or fails its checksum; when it is such a tail it
  moves every byte from there on into ``quarantine/`` and truncates — never a misread,
  never a crash, every earlier record kept.
- Damage *inside* the log (a flipped byte in a record that later, verifying records
  follow: bit rot, a bad disk, a hand edit) is never cut: that would drop every later
  record and let new appends reuse their offsets, which consumers positioned past them
  would skip (review finding). Offsets are never reused. When the damaged record's
  framing survives (its length leads to the next verifying record), the writer copies
  its bytes into ``quarantine/`` (fsync'd first) and replaces the record, atomically
  (the segment rewritten beside itself and renamed over it), by a *placeholder* of the
  same length at the same offset: a verifying record without key whose value is a JSON
  note (``{"runwatch_quarantined": {...}}``, no event type) naming the quarantine file,
  so every consumer reads it as a dead letter and every later record keeps its offset
  and byte position. When the framing is lost (a damaged length: how many records the
  bad bytes held cannot be known), the writer refuses with :class:`LogDamaged`, naming
  the topic, segment, byte position and offset: an operator repairs it (no offset can
  be kept safely).
- Reading never writes. A read-only :class:`TopicLog` (``readonly=True``) creates, locks,
  truncates and moves nothing, so it works on a copied, read-only or evidence log and
  leaves it byte-identical. Readers verify each record's checksum too (when indexing, and
  again when reading) and stop at the first bad or incomplete one, treating it as the
  current end (a concurrent writer may be mid-``write``); :meth:`TopicLog.torn_tail` says
  where that is and how many bytes lie past it (:class:`TornTail`): exactly what a
  writer's open would cut when it is a tail (damage inside the log a writer replaces by
  a placeholder, or refuses to touch, as above).
- ``timestamp_ns`` is the appender's wall clock, made strictly increasing per process;
  merges across topics order by it (see :class:`events.log.embedded.EmbeddedLog`).
"""

from __future__ import annotations

import bisect
import fcntl
import json
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

_log = logging.getLogger("events.log")

HEADER = struct.Struct("<IIqH")
LENGTH = struct.Struct("<I")
CRC_PART = struct.Struct("<qH")
NO_KEY = 0xFFFF
_HSIZE = HEADER.size
SEGMENT_SUFFIX = ".seg"
#: Roll to a new segment file once the active one is this big.
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
#: One sparse-index entry every this many records.
INDEX_EVERY = 1024
#: Bytes read per file read while iterating records.
READ_CHUNK = 1 << 20

_last_ns = 0


def monotonic_ns() -> int:
    """Wall-clock ns, strictly increasing within this process."""
    global _last_ns
    now = time.time_ns()
    _last_ns = now if now > _last_ns else _last_ns + 1
    return _last_ns


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a create, a rename) survive a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` all at once: a temporary file beside it, fsync'd,
    renamed over it, the rename fsync'd. A crash leaves the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def frame(key: bytes | None, value: bytes, timestamp_ns: int) -> bytes:
    """The bytes of one record."""
    key_bytes = b"" if key is None else key
    key_len = NO_KEY if key is None else len(key_bytes)
    if key is not None and len(key_bytes) >= NO_KEY:
        raise ValueError(f"key too long ({len(key_bytes)} bytes)")
    tail = CRC_PART.pack(timestamp_ns, key_len) + key_bytes + value
    crc = zlib.crc32(tail)
    return struct.pack("<II", len(key_bytes) + len(value), crc) + tail


@dataclass(slots=True)
class RawRecord:
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ns: int


def parse(buf: bytes | memoryview, pos: int) -> tuple[RawRecord | None, int, str | None]:
    """Parse the record at ``pos``: (record without offset, next pos, problem).

    ``problem`` is ``None`` for a good record, ``"short"`` when the buffer ends inside
    the record, ``"checksum"`` when the bytes do not match their crc.
    """
    end = len(buf)
    if pos + HEADER.size > end:
        return None, pos, "short"
    body_len, crc, ts_ns, key_len = HEADER.unpack_from(buf, pos)
    rec_end = pos + HEADER.size + body_len
    if rec_end > end:
        return None, pos, "short"
    if zlib.crc32(buf[pos + 8 : rec_end]) != crc:
        return None, pos, "checksum"
    kstart = pos + HEADER.size
    if key_len == NO_KEY:
        key, vstart = None, kstart
    else:
        if key_len > body_len:
            return None, pos, "checksum"
        key, vstart = bytes(buf[kstart : kstart + key_len]), kstart + key_len
    return RawRecord(-1, key, bytes(buf[vstart:rec_end]), ts_ns), rec_end, None


#: One record as the bulk reader returns it: (timestamp_ns, offset, key, value).
RawTuple = tuple[int, int, "bytes | None", bytes]


def _parse_run(buf: bytes, offset: int, stop: int) -> tuple[list[RawTuple], int, int, str | None]:
    """Every whole, verified record at the start of ``buf`` (the first at ``offset``,
    none at or past ``stop``): (records, position after them, next offset, problem)
    where ``problem`` is ``"short"`` (buffer ends inside a record), ``"checksum"`` or
    ``None`` (reached ``stop``). :func:`parse` in a loop, with its lookups hoisted."""
    out: list[RawTuple] = []
    append = out.append
    unpack, crc32, hsize = HEADER.unpack_from, zlib.crc32, HEADER.size
    view = memoryview(buf)
    end, pos = len(buf), 0
    while offset < stop:
        if pos + hsize > end:
            return out, pos, offset, "short"
        body_len, crc, ts_ns, key_len = unpack(buf, pos)
        kstart = pos + hsize
        rec_end = kstart + body_len
        if rec_end > end:
            return out, pos, offset, "short"
        if crc32(view[pos + 8 : rec_end]) != crc:
            return out, pos, offset, "checksum"
        if key_len == NO_KEY:
            append((ts_ns, offset, None, buf[kstart:rec_end]))
        elif key_len > body_len:
            return out, pos, offset, "checksum"
        else:
            vstart = kstart + key_len
            append((ts_ns, offset, buf[kstart:vstart], buf[vstart:rec_end]))
        pos, offset = rec_end, offset + 1
    return out, pos, offset, None


def _verifies(buf: bytes, pos: int) -> int | None:
    """The timestamp of a whole record verifying at ``pos`` of ``buf``, else None."""
    if pos < 0 or pos + _HSIZE > len(buf):
        return None
    body_len, crc, ts_ns, key_len = HEADER.unpack_from(buf, pos)
    rec_end = pos + _HSIZE + body_len
    if rec_end > len(buf) or (key_len != NO_KEY and key_len > body_len):
        return None
    if zlib.crc32(memoryview(buf)[pos + 8 : rec_end]) != crc:
        return None
    return int(ts_ns)


def _next_record(buf: bytes, start: int, hint: int | None) -> tuple[int, int] | None:
    """(position, timestamp_ns) of the first record that verifies in ``buf`` at or after
    ``start`` (``hint`` tried first: where the damaged record's length says the next
    begins); None when none does. A false match needs a crc32 collision (2**-32)."""
    if hint is not None and hint >= start:
        stamp = _verifies(buf, hint)
        if stamp is not None:
            # the hint is the answer unless a record verifies before it (checked below)
            for pos in range(start, hint):
                early = _verifies(buf, pos)
                if early is not None:
                    return pos, early
            return hint, stamp
    for pos in range(start, len(buf) - _HSIZE + 1):
        stamp = _verifies(buf, pos)
        if stamp is not None:
            return pos, stamp
    return None


def _fit(note: dict[str, object], size: int) -> bytes:
    """``note`` as JSON padded with spaces to exactly ``size`` bytes (a placeholder's
    value); a shorter note, or only spaces, when it does not fit (still not an event)."""
    inner = note["runwatch_quarantined"]
    assert isinstance(inner, dict)
    for doc in (note, {"runwatch_quarantined": inner["file"]}, {"runwatch_quarantined": 1}):
        raw = json.dumps(doc, separators=(",", ":")).encode()
        if len(raw) <= size:
            return raw + b" " * (size - len(raw))
    return b" " * size


@dataclass(slots=True)
class _Segment:
    base: int
    path: Path
    count: int = 0
    size: int = 0
    #: sparse index: (offset, byte position) every INDEX_EVERY records
    index: list[tuple[int, int]] = field(default_factory=list)
    #: why the last scan stopped before the end of the file ("short" / "checksum"), and
    #: the file's (size, mtime) then: an unchanged damaged file is not read again
    problem: str | None = None
    stuck: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Recovery:
    """What :meth:`TopicLog.recover` found and did: ``action`` ``"cut"`` (a torn tail
    moved into ``quarantine/`` and the segment truncated at ``position``) or
    ``"replaced"`` (one damaged record inside the log, at ``offset``, moved into
    ``quarantine/`` and a placeholder of its length written in its place)."""

    topic: str
    segment: str
    position: int
    problem: str
    quarantined_bytes: int
    quarantine_file: str
    action: str = "cut"
    #: the offset of the first record cut, or of the record replaced
    offset: int = -1


class LogDamaged(RuntimeError):
    """A topic is damaged inside (verifying records follow the bad bytes) in a way a
    writer cannot repair without guessing offsets: appends are refused until an operator
    repairs it (reads still stop before it). Names where it is."""

    #: the CLI prints the message as it is (the log's state, not a bug in runwatch)
    told_as_is = True

    def __init__(
        self, topic: str, segment: str, position: int, offset: int, problem: str, resumes: str
    ) -> None:
        self.topic, self.segment, self.position = topic, segment, position
        self.offset, self.problem = offset, problem
        super().__init__(
            f"{topic}: record at offset {offset} ({segment} byte {position}) is damaged "
            f"({problem}) and verifying records follow it ({resumes}): not a torn tail. "
            "Its length does not lead to that record, so how many records the damaged "
            "bytes held cannot be known: "
            "refusing to append (cutting it would drop every later record and reuse their "
            "offsets). Reads stop before it. Repair by hand: move the damaged bytes aside "
            "(the log's readers report them as a torn tail) keeping the later records' "
            "offsets, or restore the segment from a copy."
        )


@dataclass(frozen=True, slots=True)
class TornTail:
    """What a read-only open found past a topic's last good record and left in place:
    every read ends at ``offset``; a writer's open would cut the same ``bytes`` (from
    ``position`` of ``segment`` on, later segments included) into ``quarantine/``."""

    topic: str
    #: the segment file holding the first bad byte, and that byte's position in it
    segment: str
    position: int
    #: the offset reads end at (the topic's readable end)
    offset: int
    #: "short" (the files end inside a record) or "checksum" (a record fails its crc)
    problem: str
    #: bytes skipped: the rest of that segment and every later segment
    bytes: int
    #: whole segment files after it, skipped with it
    later_segments: int

    def as_dict(self) -> dict[str, str | int]:
        return {
            "topic": self.topic,
            "offset": self.offset,
            "bytes": self.bytes,
            "problem": self.problem,
            "segment": self.segment,
            "position": self.position,
            "later_segments": self.later_segments,
        }

    def describe(self) -> str:
        later = f" and {self.later_segments} later segment(s)" if self.later_segments else ""
        return (
            f"{self.topic}: torn tail skipped at offset {self.offset} ({self.bytes} bytes "
            f"from {self.segment} byte {self.position}{later}, {self.problem}); "
            "left as it is (only a writer's open moves it into quarantine/)"
        )


class TopicLog:
    """One topic of the embedded log (a single partition)."""

    def __init__(
        self,
        directory: Path,
        *,
        sync: bool = True,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        readonly: bool = False,
    ):
        """``readonly``: never create, lock, append, truncate or move anything (a missing
        directory reads as an empty topic); :meth:`recover` and :meth:`append` refuse."""
        self.readonly = readonly
        self.dir = directory
        self.name = directory.name
        self.sync = sync
        self.segment_bytes = segment_bytes
        if not readonly:
            self.dir.mkdir(parents=True, exist_ok=True)
        self._segments: list[_Segment] = []
        #: what appends repaired (:meth:`recover` returns its own): see :class:`Recovery`
        self.repairs: list[Recovery] = []
        self._lock_path = self.dir / "LOCK"
        self.refresh()

    # -- reading the files -------------------------------------------------------------

    def _segment_files(self) -> list[Path]:
        return sorted(self.dir.glob("*" + SEGMENT_SUFFIX))

    def refresh(self) -> None:
        """Catch up with records other processes appended (index only what is new)."""
        files = self._segment_files()
        known = {s.path for s in self._segments}
        for path in files:
            if path not in known:
                self._segments.append(_Segment(base=int(path.stem), path=path))
        if not self._segments and not files:
            return
        for seg in self._segments:
            self._scan(seg)

    def _scan(self, seg: _Segment) -> tuple[int, str | None]:
        """Index the verified records appended to ``seg`` since the last scan; (stop
        pos, problem). Only reads: the same for readers and writers, so both see the log
        end at the same record."""
        try:
            st = seg.path.stat()
        except FileNotFoundError:
            return seg.size, None
        size = st.st_size
        if size == seg.size or seg.stuck == (size, st.st_mtime_ns):
            return seg.size, seg.problem
        with open(seg.path, "rb") as f:
            f.seek(seg.size)
            buf = f.read(size - seg.size)
        view = memoryview(buf)
        index, base, size_before = seg.index, seg.base, seg.size
        count, pos, end, problem = seg.count, 0, len(buf), None
        unpack, crc32, hsize = HEADER.unpack_from, zlib.crc32, _HSIZE
        while pos < end:  # hot at open: every record of the log passes here once
            if pos + hsize > end:
                problem = "short"
                break
            body_len, crc, _, key_len = unpack(buf, pos)
            nxt = pos + hsize + body_len
            if nxt > end:
                problem = "short"
                break
            if crc32(view[pos + 8 : nxt]) != crc or (key_len != NO_KEY and key_len > body_len):
                problem = "checksum"
                break
            if count % INDEX_EVERY == 0:
                index.append((base + count, size_before + pos))
            count += 1
            pos = nxt
        seg.count = count
        seg.size += pos
        seg.problem = problem
        seg.stuck = (size, st.st_mtime_ns) if problem else None
        return seg.size, problem

    def _first_damage(self) -> tuple[int, int] | None:
        """(index of the first segment whose file goes on past its last good record,
        that file's size), or None when every byte is indexed."""
        for i, seg in enumerate(self._segments):
            try:
                actual = seg.path.stat().st_size
            except FileNotFoundError:
                continue
            if actual != seg.size:
                return i, actual
        return None

    def torn_tail(self) -> TornTail | None:
        """Where reads of this topic end before the end of its files, as of the last
        :meth:`refresh` (None: nothing is skipped). Looks only; changes nothing."""
        found = self._first_damage()
        if found is None:
            return None
        i, actual = found
        seg, later = self._segments[i], self._segments[i + 1 :]
        skipped = actual - seg.size
        for other in later:
            with suppress(FileNotFoundError):
                skipped += other.path.stat().st_size
        return TornTail(
            self.name,
            seg.path.name,
            seg.size,
            seg.base + seg.count,
            seg.problem or "short",
            skipped,
            len(later),
        )

    @property
    def end_offset(self) -> int:
        if not self._segments:
            return 0
        last = self._segments[-1]
        return last.base + last.count

    def read(self, from_offset: int = 0, max_records: int | None = None) -> Iterator[RawRecord]:
        """Records from ``from_offset`` to the currently known end (call :meth:`refresh`
        first to see other processes' appends). Reads in chunks of ``READ_CHUNK`` bytes."""
        remaining = max_records if max_records is not None else -1
        stop = from_offset + max_records if max_records is not None else None
        for chunk in self.read_chunks(from_offset, stop):
            for ts_ns, offset, key, value in chunk:
                yield RawRecord(offset, key, value, ts_ns)
                remaining -= 1
                if remaining == 0:
                    return

    def read_chunks(
        self, from_offset: int = 0, to_offset: int | None = None
    ) -> Iterator[list[RawTuple]]:
        """Verified records from ``from_offset`` to ``to_offset`` (exclusive; default: the
        currently known end), as lists of ``(timestamp_ns, offset, key, value)`` in offset
        order, one list per file read (the bulk path of replays: no per-record object
        beyond the tuple). Stops at the first short or corrupt record: that is the end,
        never misread past it."""
        if from_offset < 0:
            raise ValueError("offset must be >= 0")
        segments = list(self._segments)
        for i, seg in enumerate(segments):
            if i and segments[i - 1].base + segments[i - 1].count != seg.base:
                return  # the previous segment ends in a bad record: that is the end
            seg_end = seg.base + seg.count
            if to_offset is not None:
                seg_end = min(seg_end, to_offset)
            if seg_end <= from_offset or seg_end <= seg.base:
                continue
            offset, file_pos = self._locate(seg, max(from_offset, seg.base))
            limit = seg.size
            rest = b""
            with open(seg.path, "rb") as f:
                f.seek(file_pos)
                while offset < seg_end:
                    if file_pos >= limit:
                        return  # the indexed bytes end inside a record
                    want = min(max(READ_CHUNK, 2 * len(rest)), limit - file_pos)
                    buf = rest + f.read(want)
                    file_pos += want
                    out, pos, offset, problem = _parse_run(buf, offset, seg_end)
                    if out and out[0][1] < from_offset:  # located before it: skip
                        out = [r for r in out if r[1] >= from_offset]
                    if out:
                        yield out
                    if problem == "checksum":
                        return
                    rest = buf[pos:]

    def _locate(self, seg: _Segment, offset: int) -> tuple[int, int]:
        i = bisect.bisect_right(seg.index, (offset, float("inf"))) - 1
        if i < 0:
            return seg.base, 0
        return seg.index[i]

    # -- writing -----------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def recover(self) -> list[Recovery]:
        """Verify every record and repair what a writer may (see the module docstring):
        cut a torn tail into ``quarantine/``, replace a damaged record inside the log by
        a placeholder; :class:`LogDamaged` when neither is safe. A writer's job: a
        read-only topic refuses."""
        if self.readonly:
            raise PermissionError(f"{self.dir} is open read-only: a reader never repairs")
        with self._locked():
            self._segments = []
            self.refresh()
            return self._repair()

    def _repair(self) -> list[Recovery]:
        """Repair from the first bad record on until every byte is indexed (writers only,
        under the lock, after a :meth:`refresh`): what was done, in order."""
        done: list[Recovery] = []
        seen: set[tuple[int, int]] = set()
        while (damage := self._first_damage()) is not None:
            i = damage[0]
            seg = self._segments[i]
            where = (i, seg.size)
            if where in seen:  # a placeholder that does not verify: never loop
                raise RuntimeError(f"{self.name}: repair of {seg.path.name} made no progress")
            seen.add(where)
            resume = self._resumes_after(i)
            framed = self._framed(i, resume)
            if framed is not None:
                done.append(self._replace(i, framed, resume))
                _log.warning("embedded log repaired: %s", done[-1])
            elif resume is None:
                done.append(self._cut_tail(i))
                _log.warning("embedded log repaired: %s", done[-1])
            else:
                j, q, _ = resume
                seg_j = self._segments[j].path.name
                raise LogDamaged(
                    self.name,
                    seg.path.name,
                    seg.size,
                    seg.base + seg.count,
                    seg.problem or "short",
                    f"the next at {seg_j} byte {q}",
                )
        return done

    def _resumes_after(self, i: int) -> tuple[int, int, int] | None:
        """The first verifying record after the first bad byte of segment ``i``, as
        (segment index, byte position, its timestamp_ns); None when none follows (a torn
        tail). The damaged record's own length is tried first, then every byte after the
        damage (only damaged topics pay for this, once)."""
        seg = self._segments[i]
        with open(seg.path, "rb") as f:
            f.seek(seg.size)
            buf = f.read()
        hint = None
        if len(buf) >= _HSIZE:
            hint = _HSIZE + HEADER.unpack_from(buf, 0)[0]
        found = _next_record(buf, 1, hint)
        if found is not None:
            return i, seg.size + found[0], found[1]
        for j in range(i + 1, len(self._segments)):
            try:
                data = self._segments[j].path.read_bytes()
            except FileNotFoundError:
                continue
            found = _next_record(data, 0, 0)
            if found is not None:
                return j, found[0], found[1]
        return None

    def _framed(self, i: int, resume: tuple[int, int, int] | None) -> int | None:
        """The end (byte position in segment ``i``) of the damaged record at the first bad
        byte of segment ``i`` when it is one whole record whose length survived: it ends
        where the next verifying record starts (in this segment, or at the start of the
        next segment, whose base offset follows it), or it is the last record of the log
        and ends exactly at the end of its file. None otherwise."""
        seg = self._segments[i]
        try:
            size = seg.path.stat().st_size
        except FileNotFoundError:
            return None
        with open(seg.path, "rb") as f:
            f.seek(seg.size)
            head = f.read(_HSIZE)
        if len(head) < _HSIZE:
            return None
        body_len = HEADER.unpack(head)[0]
        rec_end = seg.size + _HSIZE + body_len
        if rec_end > size:
            return None  # short: the files end inside it
        if resume is None:
            last = all(
                not s.path.exists() or s.path.stat().st_size == 0 for s in self._segments[i + 1 :]
            )
            return rec_end if last and rec_end == size else None
        j, q, _ = resume
        if j == i and q == rec_end:
            return rec_end
        nxt = seg.base + seg.count + 1
        if j == i + 1 and q == 0 and rec_end == size and self._segments[j].base == nxt:
            return rec_end
        return None

    def _stamp_before(self, i: int) -> int:
        """The timestamp of the last good record before the damage in segment ``i`` (or
        the segment before it); 0 when there is none."""
        for seg in (self._segments[i], self._segments[i - 1] if i else None):
            if seg is None or not seg.count:
                continue
            pos = self._locate(seg, seg.base + seg.count - 1)[1]
            with open(seg.path, "rb") as f:
                f.seek(pos)
                buf = f.read(seg.size - pos)
            stamp, at = 0, 0
            while at < len(buf):
                rec, at, problem = parse(buf, at)
                if rec is None or problem is not None:
                    break
                stamp = rec.timestamp_ns
            return stamp
        return 0

    def _replace(self, i: int, rec_end: int, resume: tuple[int, int, int] | None) -> Recovery:
        """Replace the damaged record ``[seg.size, rec_end)`` of segment ``i`` by a
        placeholder of the same length (writers only, under the lock). Its bytes go to
        ``quarantine/`` first (fsync'd); the segment is then rewritten atomically, so a
        crash leaves the damaged segment (repaired again on the next open) or the
        repaired one. Same length: every later byte position (and readers' indexes of
        them) stays valid."""
        seg = self._segments[i]
        at, offset = seg.size, seg.base + seg.count
        problem = seg.problem or "checksum"
        data = seg.path.read_bytes()
        bad = data[at:rec_end]
        qdir = self.dir / "quarantine"
        qdir.mkdir(exist_ok=True)
        qfile = qdir / f"{seg.path.stem}-record-{offset}-at-{at}-{time.time_ns()}.bin"
        with open(qfile, "wb") as q:
            q.write(bad)
            q.flush()
            os.fsync(q.fileno())
        fsync_dir(qdir)
        own = HEADER.unpack_from(bad, 0)[2]
        lo = self._stamp_before(i)
        hi = resume[2] if resume is not None else monotonic_ns()
        stamp = own if lo <= own <= hi else (lo or hi)
        note = {
            "runwatch_quarantined": {
                "reason": f"record damaged on disk ({problem}); its bytes were moved aside",
                "topic": self.name,
                "offset": offset,
                "segment": seg.path.name,
                "position": at,
                "bytes": len(bad),
                "file": f"quarantine/{qfile.name}",
            }
        }
        placeholder = frame(None, _fit(note, len(bad) - _HSIZE), stamp)
        assert len(placeholder) == len(bad)
        write_atomically(seg.path, data[:at] + placeholder + data[rec_end:])
        seg.problem, seg.stuck = None, None
        self._scan(seg)
        return Recovery(
            self.name, seg.path.name, at, problem, len(bad), str(qfile), "replaced", offset
        )

    def _cut_tail(self, i: int) -> Recovery:
        """Move every byte from the first bad record of segment ``i`` on (later segments
        included) into ``quarantine/`` and truncate there: a torn tail, from which no
        verifying record follows. Writers only, under the lock."""
        seg = self._segments[i]
        qdir = self.dir / "quarantine"
        qdir.mkdir(exist_ok=True)
        qfile = qdir / f"{seg.path.stem}-at-{seg.size}-{time.time_ns()}.bin"
        moved = 0
        with open(qfile, "wb") as q:
            for later in self._segments[i:]:
                with open(later.path, "rb") as f:
                    f.seek(seg.size if later is seg else 0)
                    chunk = f.read()
                q.write(chunk)
                moved += len(chunk)
            q.flush()
            os.fsync(q.fileno())
        with open(seg.path, "r+b") as f:
            f.truncate(seg.size)
            f.flush()
            os.fsync(f.fileno())
        for later in self._segments[i + 1 :]:
            later.path.unlink()
        self._segments = self._segments[: i + 1]
        problem, seg.problem, seg.stuck = seg.problem or "short", None, None
        return Recovery(
            self.name, seg.path.name, seg.size, problem, moved, str(qfile), "cut",
            seg.base + seg.count,
        )  # fmt: skip

    def append(
        self,
        records: Sequence[tuple[bytes | None, bytes]],
        timestamps_ns: Sequence[int] | None = None,
    ) -> list[int]:
        """Append records in one write under the lock; their offsets once durable.

        ``timestamps_ns``: the records' append times when the caller stamped them (a
        multi-topic batch stamped in the caller's order; an export keeping the source's
        times); default: now, per record."""
        if not records:
            return []
        if timestamps_ns is not None and len(timestamps_ns) != len(records):
            raise ValueError("one timestamp per record")
        if self.readonly:
            raise PermissionError(f"{self.dir} is open read-only: no appends")
        with self._locked():
            self.refresh()
            # a crashed writer's torn tail is cut, damage inside replaced (or refused:
            # LogDamaged); offsets are never reused. We hold the lock.
            self.repairs.extend(self._repair())
            if not self._segments or self._segments[-1].size >= self.segment_bytes:
                base = self.end_offset
                path = self.dir / f"{base:020d}{SEGMENT_SUFFIX}"
                path.touch()
                fsync_dir(self.dir)  # the new segment's directory entry is durable too
                self._segments.append(_Segment(base=base, path=path))
            seg = self._segments[-1]
            first = seg.base + seg.count
            parts, index, size, count = [], [], seg.size, seg.count
            for i, (key, value) in enumerate(records):
                if count % INDEX_EVERY == 0:
                    index.append((seg.base + count, size))
                ts = monotonic_ns() if timestamps_ns is None else timestamps_ns[i]
                data = frame(key, value, ts)
                parts.append(data)
                size += len(data)
                count += 1
            with open(seg.path, "ab") as f:
                f.write(b"".join(parts))
                f.flush()
                if self.sync:
                    os.fsync(f.fileno())
            # only now, with the bytes on disk, does the in-memory view move
            seg.index.extend(index)
            seg.size, seg.count = size, count
            return list(range(first, first + len(records)))
