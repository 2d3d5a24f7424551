"""Damage inside the embedded log is never cut; offsets are never reused.

Review finding: a flipped byte in a record that had already been read made the next
writer's open (or append) cut it and every later record into ``quarantine/``; new records
were then appended at the reused offsets, and a host whose stored position was past them
skipped them silently. Now a writer cuts only a torn tail (no verifying record follows
the damage), replaces one damaged record whose length survived by a same-length
placeholder at its offset (its bytes quarantined), refuses (:class:`LogDamaged`) when
the length is lost, and the embedded host fails loudly
(:class:`~runwatch.hosting.host.PositionBeyondEnd`) when its stored position is past the
log's end. Real files, and real processes where a process boundary is crossed.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from events import DeadLetter, TrainerStepCompleted, decode
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from events.log.segments import HEADER, LogDamaged
from runwatch.hosting.embedded import EmbeddedHost
from runwatch.hosting.host import PositionBeyondEnd
from tests.event_samples import sample
from tests.unit.events.test_embedded_log_readonly import snapshot

TOPIC = "runwatch.telemetry"
REPO = Path(__file__).resolve().parents[3]


def _steps(lo: int, hi: int) -> list[TrainerStepCompleted]:
    return [sample(TrainerStepCompleted, i, run_id="run-1") for i in range(lo, hi)]


def _starts(seg: Path) -> list[int]:
    raw, pos, out = seg.read_bytes(), 0, []
    while pos < len(raw):
        out.append(pos)
        pos += HEADER.size + struct.unpack_from("<I", raw, pos)[0]
    return out


def _flip(seg: Path, at: int, mask: int = 0x01) -> None:
    raw = bytearray(seg.read_bytes())
    raw[at] ^= mask
    seg.write_bytes(bytes(raw))


def _log(root: Path, n: int = 10) -> tuple[EmbeddedLog, Path]:
    log = EmbeddedLog(root, sync=False)
    log.open_sync()
    log.append_events_sync(_steps(0, n))
    return log, next((root / TOPIC).glob("*.seg"))


class Steps:
    """Collects a run's steps."""

    name, inputs = "steps", (TOPIC,)

    def initial(self) -> list[int]:
        return []

    def key_of(self, event: EventBase) -> str:
        return event.run_id

    def apply(self, state: list[int], event: EventBase) -> tuple[list[int], Sequence[EventBase]]:
        return [*state, event.step], ()

    def dump_state(self, state: list[int]) -> bytes:
        return ",".join(map(str, state)).encode()

    def load_state(self, raw: bytes) -> list[int]:
        return [int(x) for x in raw.decode().split(",") if x]


def test_a_flipped_byte_in_a_read_record_loses_no_later_record(tmp_path: Path) -> None:
    """The reviewer's case: the host folded steps 0..9; a byte of record 3 flips; another
    process appends steps 10..14; the host, restarted, folds them (before: they landed at
    offsets 3..7, which the host skipped)."""
    log, seg = _log(tmp_path)
    EmbeddedHost(log, [Steps()]).run_once()
    start = _starts(seg)[3]
    original = seg.read_bytes()[start : _starts(seg)[4]]
    _flip(seg, start + 40)
    appended = subprocess.run(  # a producer in another process: its open repairs
        [sys.executable, "-c", (
            "import sys; from events.log.embedded import EmbeddedLog; "
            "from tests.unit.events.test_embedded_log_damage import _steps; "
            "log = EmbeddedLog(sys.argv[1], sync=False); rec = log.open_sync(); "
            "print([a.offset for a in log.append_events_sync(_steps(10, 15))], rec)"
        ), str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert appended.returncode == 0, appended.stderr
    assert appended.stdout.startswith("[10, 11, 12, 13, 14]"), appended.stdout
    assert "action='replaced', offset=3" in appended.stdout
    host = EmbeddedHost(EmbeddedLog(tmp_path), [Steps()])
    host.run_once()
    assert host.host.states("steps")["run-1"] == list(range(15))
    [qfile] = (tmp_path / TOPIC / "quarantine").iterdir()
    assert qfile.read_bytes()[:40] == original[:40] and len(qfile.read_bytes()) == len(original)
    back = list(EmbeddedLog(tmp_path, readonly=True).read_sync(TOPIC))
    assert [r.offset for r in back] == list(range(15))
    letter = decode(back[3].value)
    assert isinstance(letter, DeadLetter) and f"quarantine/{qfile.name}".encode() in letter.raw


def test_a_reader_tailing_the_log_reads_on_after_the_repair(tmp_path: Path) -> None:
    _, seg = _log(tmp_path)
    _flip(seg, _starts(seg)[6] + 50)
    reader = EmbeddedLog(tmp_path, readonly=True)
    assert [r.offset for r in reader.read_sync(TOPIC)] == list(range(6))  # stops before it
    [rec] = EmbeddedLog(tmp_path).open_sync()
    assert (rec.action, rec.offset, rec.problem) == ("replaced", 6, "checksum")
    offsets = [r.offset for r in reader.read_sync(TOPIC, from_offset=6)]
    assert offsets == list(range(6, 10)) and reader.torn_tails() == []


def test_a_damaged_last_whole_record_is_replaced_not_cut(tmp_path: Path) -> None:
    """A whole record at the end that fails its checksum may have been read already: it
    keeps its offset (a placeholder), so the next append cannot reuse it."""
    _, seg = _log(tmp_path)
    _flip(seg, _starts(seg)[9] + 30)
    writer = EmbeddedLog(tmp_path)
    [rec] = writer.open_sync()
    assert (rec.action, rec.offset) == ("replaced", 9)
    assert [a.offset for a in writer.append_events_sync(_steps(10, 11))] == [10]


def test_a_lost_length_inside_the_log_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    """The damaged record's length is wrong, so how many records its bytes held cannot be
    known: the writer refuses to open or append, naming where, and touches nothing."""
    _, seg = _log(tmp_path)
    struct.pack_into("<I", raw := bytearray(seg.read_bytes()), _starts(seg)[4], 1 << 20)
    seg.write_bytes(bytes(raw))
    before = snapshot(tmp_path / TOPIC)
    with pytest.raises(LogDamaged) as refused:
        EmbeddedLog(tmp_path).open_sync()
    message = str(refused.value)
    assert f"{TOPIC}: record at offset 4 ({seg.name} byte {_starts(seg)[4]})" in message
    assert refused.value.offset == 4 and refused.value.segment == seg.name
    with pytest.raises(LogDamaged):  # a producer's first append (no open): refused too
        EmbeddedLog(tmp_path).append_events_sync(_steps(10, 11))
    assert snapshot(tmp_path / TOPIC) == before
    reader = EmbeddedLog(tmp_path, readonly=True)
    assert [r.offset for r in reader.read_sync(TOPIC)] == list(range(4))


def test_a_torn_tail_is_still_cut(tmp_path: Path) -> None:
    """A crash mid-append (an incomplete last record) is cut as before: nothing verifies
    after it, nothing was acknowledged from it."""
    _, seg = _log(tmp_path)
    os.truncate(seg, seg.stat().st_size - 25)
    writer = EmbeddedLog(tmp_path)
    [rec] = writer.open_sync()
    assert (rec.action, rec.offset, rec.problem) == ("cut", 9, "short")
    assert [a.offset for a in writer.append_events_sync(_steps(10, 11))] == [9]


def test_a_crash_mid_repair_leaves_the_damaged_segment_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, seg = _log(tmp_path)
    _flip(seg, _starts(seg)[2] + 60)
    damaged = seg.read_bytes()

    def killed(src: object, dst: object) -> None:
        raise KeyboardInterrupt("killed before the rename")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        EmbeddedLog(tmp_path).open_sync()
    assert seg.read_bytes() == damaged  # the previous state, intact
    monkeypatch.undo()
    [rec] = EmbeddedLog(tmp_path).open_sync()  # the next open repairs it
    assert (rec.action, rec.offset) == ("replaced", 2)
    assert len(list((tmp_path / TOPIC / "quarantine").iterdir())) == 2  # both kept


def test_a_host_past_the_log_end_fails_loudly(tmp_path: Path) -> None:
    """The log was restored from an older copy (or cut): the host's stored position is
    past its end. It refuses, naming the topic and both numbers, rather than skip the
    records appended at the offsets it passed."""
    log, seg = _log(tmp_path, 5)
    older = tmp_path.parent / f"{tmp_path.name}-older.seg"
    shutil.copyfile(seg, older)
    log.append_events_sync(_steps(5, 10))
    EmbeddedHost(log, [Steps()]).run_once()
    shutil.copyfile(older, seg)
    host = EmbeddedHost(EmbeddedLog(tmp_path), [Steps()])
    with pytest.raises(PositionBeyondEnd) as stopped:
        host.run_once()
    assert f"{TOPIC}:0: this host's stored position is 10 but the log ends at 5" in str(
        stopped.value
    )


def test_kill_9_mid_append_leaves_whole_records_and_no_repair(tmp_path: Path) -> None:
    """A writer killed (-9) while appending in a loop: the next writer's open finds only
    whole records (or a torn tail it cuts), offsets dense, and never refuses."""
    child = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys; from events.log.embedded import EmbeddedLog; "
            "from tests.unit.events.test_embedded_log_damage import _steps; "
            "log = EmbeddedLog(sys.argv[1], sync=False); log.open_sync(); batch = _steps(0, 200)\n"
            "while True: log.append_events_sync(batch)"
        ), str(tmp_path)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any((tmp_path / TOPIC).glob("*.seg")):
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    writer = EmbeddedLog(tmp_path)
    repairs = writer.open_sync()
    assert all(r.action == "cut" for r in repairs)
    offsets = [r.offset for r in writer.read_sync(TOPIC)]
    assert offsets and offsets == list(range(len(offsets)))
    assert [a.offset for a in writer.append_events_sync(_steps(0, 1))] == [len(offsets)]
