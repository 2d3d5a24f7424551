"""The embedded processors' fold state on disk: a snapshot plus a journal of commits.

A commit writes what changed, not every key the fold ever held (50,000 runs made every
save take 630 ms for every tenant); a commit cut short by a crash did not happen; a
compaction interrupted anywhere leaves a state that loads to the last commit.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

import runwatch.hosting.state_journal as journal_mod
from runwatch.hosting.state_journal import DamagedState, FoldStateFile


def _b64(i: int) -> str:
    return base64.b64encode(f"slot-{i}".encode() * 4).decode()


def _fresh(directory: Path) -> FoldStateFile:
    state = FoldStateFile(directory / "run_health.state.json", "run_health", sync=False)
    state.load()
    return state


def test_a_commit_writes_what_changed_not_every_key(tmp_path: Path) -> None:
    state = _fresh(tmp_path)
    state.commit({"runwatch.telemetry": 1}, {f"run-{i}": _b64(i) for i in range(20_000)})
    snapshot = state.snapshot.stat()  # the first commit outgrew the journal: a snapshot
    assert state.generation == 1 and not state.journal().exists()
    for n in range(2, 102):
        state.commit({"runwatch.telemetry": n}, {"run-7": _b64(n)})
    after = state.snapshot.stat()
    assert (after.st_ino, after.st_mtime_ns) == (snapshot.st_ino, snapshot.st_mtime_ns)
    per_commit = state.journal().stat().st_size / 100
    assert per_commit < 200, per_commit  # one key and the positions, not 20,000 keys
    again = _fresh(tmp_path)
    assert again.positions == {"runwatch.telemetry": 101}
    assert again.slots["run-7"] == _b64(101) and again.slots["run-8"] == _b64(8)
    assert len(again.slots) == 20_000


def test_a_commit_cut_short_by_a_crash_did_not_happen(tmp_path: Path) -> None:
    state = _fresh(tmp_path)
    state.commit({"t": 1}, {"a": _b64(1)})
    state.commit({"t": 2}, {"a": _b64(2)})
    whole = state.journal().read_bytes()
    line = json.dumps({"positions": {"t": 3}, "slots": {"a": _b64(3)}}).encode()
    for cut in (1, len(line) // 2, len(line)):  # no newline: the write did not finish
        state.journal().write_bytes(whole + line[:cut])
        again = _fresh(tmp_path)
        assert again.positions == {"t": 2} and again.slots == {"a": _b64(2)}
        assert state.journal().read_bytes() == whole  # cut off before anything is appended
    again.commit({"t": 3}, {"b": _b64(9)})
    last = _fresh(tmp_path)
    assert last.positions == {"t": 3} and last.slots == {"a": _b64(2), "b": _b64(9)}


def test_compaction_keeps_every_commit_and_its_leftovers_are_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_mod, "MIN_COMPACT_BYTES", 2_000)
    state = _fresh(tmp_path)
    for n in range(1, 400):
        state.commit({"t": n}, {f"k{n % 37}": _b64(n)})
    assert state.generation >= 3
    names = {p.name for p in tmp_path.iterdir()}
    assert names <= {"run_health.state.json", f"run_health.state.{state.generation}.journal"}
    expected = (dict(state.positions), dict(state.slots))
    # a compaction that died after its snapshot, before removing the old journal
    stale = tmp_path / f"run_health.state.{state.generation - 1}.journal"
    stale.write_bytes(json.dumps({"positions": {"t": 1}, "slots": {"k1": "old"}}).encode() + b"\n")
    again = _fresh(tmp_path)
    assert (again.positions, again.slots) == expected
    assert not stale.exists()


def test_a_snapshot_written_before_journals_loads_as_generation_zero(tmp_path: Path) -> None:
    old = {"fold": "run_health", "positions": {"t": 5}, "slots": {"a": _b64(1)}}
    (tmp_path / "run_health.state.json").write_text(json.dumps(old))
    state = _fresh(tmp_path)
    assert state.generation == 0 and state.positions == {"t": 5}
    state.commit({"t": 6}, {"b": _b64(2)})
    again = _fresh(tmp_path)
    assert again.positions == {"t": 6} and again.slots == {"a": _b64(1), "b": _b64(2)}


@pytest.mark.parametrize(
    "line",
    [b"[1, 2]", b'{"positions": {"t": "x"}, "slots": {}}', b'{"positions": {"t": 1e400}}',
     b"null", b'{"positions": {}, "slots": {"a": 7}}', b"not json"],
)  # fmt: skip
def test_a_damaged_line_before_the_last_stops_the_load_and_says_how_to_rebuild(
    tmp_path: Path, line: bytes
) -> None:
    """Round four, second pass: a valid-JSON line of the wrong shape crashed the load with
    a traceback, and a damaged line in the middle silently dropped every later commit."""
    state = _fresh(tmp_path)
    state.commit({"t": 1}, {"a": _b64(1)})
    good = state.journal().read_bytes()
    state.journal().write_bytes(good + line + b"\n" + good)
    with pytest.raises(DamagedState, match=r"line 2 is damaged.*rebuild it from the log"):
        _fresh(tmp_path)
    assert state.journal().read_bytes() == good + line + b"\n" + good  # left as found
    # the same line as the last one is a torn write: cut off, the commits before kept
    state.journal().write_bytes(good + line + b"\n")
    again = _fresh(tmp_path)
    assert again.positions == {"t": 1} and state.journal().read_bytes() == good


def test_an_append_that_failed_part_way_does_not_swallow_the_next_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of round four: a commit whose write failed half-way (a full disk) left its
    bytes; the next commit, reported done, joined that line and was cut off at the next
    load as a torn tail. The next commit now starts where the last good one ended."""
    import os

    state = _fresh(tmp_path)
    state.commit({"t": 1}, {"a": _b64(1)})
    real_write = os.write
    calls = {"n": 0}

    def half_then_fail(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(journal_mod.os, "write", half_then_fail)
    with pytest.raises(OSError):
        state.commit({"t": 2}, {"a": _b64(2)})
    state.commit({"t": 3}, {"a": _b64(3)})  # reported done: must survive a restart
    monkeypatch.undo()
    again = _fresh(tmp_path)
    assert again.positions == {"t": 3} and again.slots == {"a": _b64(3)}


def test_a_compaction_that_failed_keeps_the_generation_its_journal_is_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot write that fails (a full disk) must not move the journal to the next
    generation: the snapshot on disk still names the old one, and commits appended to a
    journal of another generation would be dropped at the next load."""
    monkeypatch.setattr(journal_mod, "MIN_COMPACT_BYTES", 300)
    state = _fresh(tmp_path)
    state.commit({"t": 1}, {"a": _b64(1)})
    real = journal_mod.write_atomically

    def fail(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal_mod, "write_atomically", fail)
    big = {f"k{i}": _b64(i) for i in range(20)}
    with pytest.raises(OSError):
        state.commit({"t": 2}, big)  # outgrows the journal: compacts, and fails
    # nothing of the failed commit is taken for durable: a later commit's positions
    # must not pass slots that were never written
    assert state.positions == {"t": 1} and "k3" not in state.slots
    monkeypatch.setattr(journal_mod, "write_atomically", real)
    state.commit({"t": 2}, big)  # the caller commits again, the disk back
    state.commit({"t": 3}, {"a": _b64(3)})
    again = _fresh(tmp_path)
    assert again.positions == {"t": 3} and again.generation == state.generation
    assert again.slots["a"] == _b64(3) and again.slots["k3"] == _b64(3)
