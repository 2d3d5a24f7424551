"""The embedded log's read-only open: reading never writes, and says what it skipped.

Every case tears a copy of a real multi-segment log, opens it read-only and checks that
(1) not one byte, file or directory changed, (2) every good record reads back, (3) the
reported torn tail is exactly what a writer's open then cuts into ``quarantine/``."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import struct
from pathlib import Path

import pytest

from events import DeadLetter, TrainerStepCompleted, decode, encode
from events.log.embedded import EmbeddedLog
from events.log.segments import HEADER, TornTail
from tests.event_samples import sample

TOPIC = "runwatch.telemetry"
OTHER = "runwatch.lifecycle"


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a file by its sha256, a directory as such."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = "<dir>"
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _steps(n: int) -> list[TrainerStepCompleted]:
    return [sample(TrainerStepCompleted, i, run_id=f"run-{i % 3}") for i in range(n)]


def _record_starts(seg: Path) -> list[int]:
    raw, pos, starts = seg.read_bytes(), 0, []
    while pos < len(raw):
        starts.append(pos)
        pos += HEADER.size + struct.unpack_from("<I", raw, pos)[0]
    return starts


def tear(seg: Path, how: str) -> None:
    """Damage ``seg`` the way a crash (or a flipped bit) would."""
    size, last = seg.stat().st_size, _record_starts(seg)[-1]
    if how == "cut7":
        os.truncate(seg, size - 7)
    elif how == "cut37":
        os.truncate(seg, size - 37)
    elif how == "header":  # the cut falls inside the last record's 18-byte header
        os.truncate(seg, last + HEADER.size // 2)
    elif how == "appended":  # half of one more record reached the disk
        with open(seg, "ab") as f:
            f.write(encode(sample(TrainerStepCompleted, 10_000))[:40])
    elif how == "flip":  # the last record fails its checksum
        with open(seg, "r+b") as f:
            f.seek(last + HEADER.size + 5)
            byte = f.read(1)
            f.seek(last + HEADER.size + 5)
            f.write(bytes([byte[0] ^ 0x40]))
    else:
        raise ValueError(how)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine") / "log"
    log = EmbeddedLog(root, sync=False, segment_bytes=4096)
    log.open_sync()
    events = _steps(240)
    for i in range(0, 240, 7):  # many appends so segments roll
        log.append_events_sync(events[i : i + 7])
    log.append_many_sync(OTHER, [(b"k", b"not json")])
    assert len(list((root / TOPIC).glob("*.seg"))) >= 5
    return root


def _copy(pristine: Path, tmp_path: Path) -> Path:
    root = tmp_path / "log"
    shutil.copytree(pristine, root)
    return root


def _segments(root: Path) -> list[Path]:
    return sorted((root / TOPIC).glob("*.seg"))


@pytest.mark.parametrize("how", ["cut7", "cut37", "header", "appended", "flip"])
def test_a_readonly_open_skips_a_torn_tail_reports_it_and_changes_nothing(
    pristine: Path, tmp_path: Path, how: str
) -> None:
    root = _copy(pristine, tmp_path)
    seg = _segments(root)[-1]
    first_in_seg = int(seg.stem)
    tear(seg, how)
    before = snapshot(root)

    log = EmbeddedLog(root, readonly=True)
    assert log.open_sync() == []
    [tail] = log.torn_tails()
    records = list(log.read_sync(TOPIC))
    merged = list(log.iter_events())
    assert log.torn_tails() == [tail]  # asking again changes nothing either
    assert snapshot(root) == before

    good = 240 if how == "appended" else 239
    assert [decode(r.value) for r in records] == _steps(240)[:good]
    assert len(merged) == good + 1  # and the other topic's (dead-letter) record
    assert isinstance(tail, TornTail)
    assert (tail.topic, tail.segment, tail.offset, tail.later_segments) == (
        TOPIC,
        seg.name,
        good,
        0,
    )
    assert tail.problem == ("checksum" if how == "flip" else "short")
    assert tail.offset > first_in_seg
    assert tail.position + tail.bytes == seg.stat().st_size
    assert tail.as_dict()["bytes"] == tail.bytes and str(tail.bytes) in tail.describe()

    # a writer's open cuts exactly that into quarantine/, and nothing else
    [cut] = EmbeddedLog(root).open_sync()
    assert (cut.topic, cut.segment, cut.position, cut.problem) == (
        tail.topic,
        tail.segment,
        tail.position,
        tail.problem,
    )
    assert cut.quarantined_bytes == tail.bytes
    assert EmbeddedLog(root, readonly=True).torn_tails() == []


def test_damage_in_an_older_segment_skips_the_later_segments_too(
    pristine: Path, tmp_path: Path
) -> None:
    root = _copy(pristine, tmp_path)
    segs = _segments(root)
    tear(segs[-3], "flip")
    before = snapshot(root)
    log = EmbeddedLog(root, readonly=True)
    log.open_sync()
    [tail] = log.torn_tails([TOPIC])
    offsets = [r.offset for r in log.read_sync(TOPIC)]
    assert offsets == list(range(tail.offset))
    assert tail.segment == segs[-3].name and tail.later_segments == 2
    assert tail.bytes == (
        segs[-3].stat().st_size - tail.position + sum(s.stat().st_size for s in segs[-2:])
    )
    assert snapshot(root) == before
    # a writer's open never cuts damage that later records follow (their offsets would be
    # reused): the one damaged record is quarantined and a placeholder keeps its offset
    damaged = segs[-3].stat().st_size - tail.position
    writer = EmbeddedLog(root)
    [fixed] = writer.open_sync()
    assert (fixed.action, fixed.offset, fixed.quarantined_bytes) == (
        "replaced",
        tail.offset,
        damaged,
    )
    assert [r.offset for r in writer.read_sync(TOPIC)] == list(range(240))


def test_a_readonly_log_creates_locks_and_commits_nothing(pristine: Path, tmp_path: Path) -> None:
    root = _copy(pristine, tmp_path)
    for lock in root.glob("*/LOCK"):  # an evidence copy need not carry the writers' locks
        lock.unlink()
    tear(_segments(root)[-1], "cut37")
    before = snapshot(root)
    log = EmbeddedLog(root, readonly=True)
    log.open_sync()
    with pytest.raises(PermissionError):
        log.append_sync(TOPIC, b"k", b"v")
    with pytest.raises(PermissionError):
        log.commit_positions("g", {TOPIC: 1})
    with pytest.raises(PermissionError):
        log._topic(TOPIC).recover()
    with pytest.raises(FileNotFoundError):
        log._topic("runwatch.alerts")  # no such topic: not created
    assert log.end_offset_sync("runwatch.alerts") == 0
    assert list(log.read_sync("runwatch.alerts")) == []

    async def consume() -> list[int]:
        await log.start()  # the async open: no registered topic is created
        consumer = await log.consumer("auditor", [TOPIC])
        got = await consumer.poll(max_records=50, timeout_s=0.1)
        await consumer.commit()  # kept in memory only
        more = await consumer.poll(max_records=500, timeout_s=0.1)
        await log.close()
        return [r.offset for r in got + more]

    assert asyncio.run(consume()) == list(range(239))
    assert snapshot(root) == before


def test_a_readonly_follower_may_start_before_the_log_exists(tmp_path: Path) -> None:
    root = tmp_path / "not-yet"
    log = EmbeddedLog(root, readonly=True)
    with pytest.raises(FileNotFoundError):
        log.open_sync()  # a read command: no log is an error

    async def follow() -> list[int]:
        await log.start()  # a follower: waits for it
        consumer = await log.consumer("g", [TOPIC])
        assert await consumer.poll(timeout_s=0.05) == []
        writer = EmbeddedLog(root)
        writer.open_sync()
        writer.append_events_sync(_steps(5))
        return [r.offset for r in await consumer.poll(timeout_s=1.0)]

    assert asyncio.run(follow()) == [0, 1, 2, 3, 4]
    assert not (root / "_groups").exists()


@pytest.mark.parametrize("how", ["cut37", "flip"])
def test_a_reader_follows_a_writer_that_repairs_and_appends(
    pristine: Path, tmp_path: Path, how: str
) -> None:
    """Reader and writer agree on where a torn log ends, so a reader that indexed the torn
    log reads on, in order, once a writer has repaired it and appended after it: an
    incomplete last record (``cut37``) is cut, its offset taken by the next append; a
    whole last record that fails its checksum (``flip``, perhaps read before it went bad)
    is replaced by a placeholder that keeps its offset, and the appends follow it."""
    root = _copy(pristine, tmp_path)
    tear(_segments(root)[-1], how)
    reader = EmbeddedLog(root, readonly=True)
    reader.open_sync()
    assert [r.offset for r in reader.read_sync(TOPIC)] == list(range(239))
    assert len(reader.torn_tails()) == 1
    writer = EmbeddedLog(root, segment_bytes=4096)
    [fixed] = writer.open_sync()
    assert (fixed.action, fixed.offset) == ("cut" if how == "cut37" else "replaced", 239)
    more = _steps(300)[239:300]
    writer.append_events_sync(more)
    assert reader.torn_tails() == []
    again = [decode(r.value) for r in reader.read_sync(TOPIC, from_offset=239)]
    if how == "flip":
        assert isinstance(again.pop(0), DeadLetter)  # the placeholder at 239
    assert again == more
    end = 300 if how == "cut37" else 301
    assert [r.offset for r in reader.read_sync(TOPIC, from_offset=239)] == list(range(239, end))
