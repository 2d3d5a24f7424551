"""Holes: records faust skipped after a seek are fetched again and folded in order."""

from __future__ import annotations

import pytest

from runwatch.hosting import faust_holes
from runwatch.hosting.faust_holes import Holes, Verdict

T = "runwatch.telemetry"


def test_a_jump_past_the_read_offset_opens_a_hole_and_seeks_back_to_it() -> None:
    """The traced race: faust's seek set its read offset back to the committed 113 while
    the fetcher already stood at 144 (113..143 were cleared from the agent's queue)."""
    holes = Holes(frozenset({T}), reseek_s=0.5)
    assert holes.fetched(T, 1, 144, read_offset=113, now=10.0) is Verdict.SEEK
    assert holes.hole_at(T, 1) == 113
    assert holes.fetched(T, 1, 145, read_offset=113, now=10.01) is Verdict.DROP  # in flight
    assert holes.fetched(T, 1, 113, read_offset=113, now=10.1) is Verdict.PASS  # back
    assert holes.open_holes == {} and holes.filled == 1
    assert holes.fetched(T, 1, 114, read_offset=113, now=10.1) is Verdict.PASS


def test_consecutive_records_and_a_first_record_pass() -> None:
    holes = Holes(frozenset({T}))
    assert holes.fetched(T, 0, 0, read_offset=None, now=0.0) is Verdict.PASS
    assert holes.fetched(T, 0, 51, read_offset=51, now=0.0) is Verdict.PASS  # after a seek
    assert holes.fetched(T, 0, 52, read_offset=51, now=0.0) is Verdict.PASS
    assert holes.open_holes == {}


def test_records_before_the_hole_and_on_other_partitions_pass() -> None:
    holes = Holes(frozenset({T}))
    holes.open(T, 1, 50, 60)
    assert holes.fetched(T, 1, 49, read_offset=60, now=0.0) is Verdict.PASS
    assert holes.fetched(T, 0, 900, read_offset=899, now=0.0) is Verdict.PASS
    assert holes.fetched(T, 1, 51, read_offset=60, now=0.0) is Verdict.SEEK


def test_a_hole_seeks_again_while_records_past_it_keep_coming() -> None:
    holes = Holes(frozenset({T}), reseek_s=0.5)
    holes.open(T, 2, 60, 70)
    assert holes.fetched(T, 2, 70, read_offset=69, now=1.0) is Verdict.SEEK
    assert holes.fetched(T, 2, 71, read_offset=70, now=1.2) is Verdict.DROP
    assert holes.fetched(T, 2, 72, read_offset=71, now=1.6) is Verdict.SEEK


def test_an_open_hole_keeps_its_lower_start() -> None:
    holes = Holes(frozenset({T}))
    holes.open(T, 2, 60, 80)
    holes.open(T, 2, 70, 80)
    holes.open(T, 2, 55, 80)
    assert holes.hole_at(T, 2) == 55


def test_records_deleted_before_they_came_back_resume_at_the_log_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Retention deleted the hole's records: after max_seeks the hole moves to the log's
    start (to be sought and filled there), so records fetched meanwhile are not skipped."""
    holes = Holes(frozenset({T}), reseek_s=0.0, max_seeks=3)
    holes.open(T, 0, 10, 20)
    verdicts = [holes.fetched(T, 0, 20 + i, read_offset=10, now=float(i)) for i in range(4)]
    assert verdicts == [Verdict.SEEK] * 3 + [Verdict.RELEASE]
    assert holes.release(T, 0, 23, log_start=15) == 10  # 10..14 are gone
    assert holes.hole_at(T, 0) == 15 and holes.given_up == 1
    assert "from offset 10 to 14 were deleted" in caplog.text
    assert holes.fetched(T, 0, 21, read_offset=15, now=9.0) is Verdict.SEEK  # stale
    assert holes.fetched(T, 0, 15, read_offset=15, now=9.1) is Verdict.PASS
    assert holes.open_holes == {}


def test_a_hole_whose_records_exist_but_never_come_is_let_go_as_a_gap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    holes = Holes(frozenset({T}), reseek_s=0.0, max_seeks=1)
    holes.open(T, 0, 10, 20)
    assert holes.fetched(T, 0, 20, read_offset=10, now=0.0) is Verdict.SEEK
    assert holes.fetched(T, 0, 21, read_offset=10, now=1.0) is Verdict.RELEASE
    assert holes.release(T, 0, 21, log_start=0) is None
    assert holes.open_holes == {} and holes.gap_accepted(T, 0, 21)
    assert "did not come back after 1 seeks" in caplog.text


def test_a_record_dropped_at_the_committed_offset_opens_a_hole_there() -> None:
    """faust delivered 90 and dropped it, then acknowledged 91..: no commit past 90."""
    holes = Holes(frozenset({T}))
    assert holes.head_missing(T, 0, committed=90, first_acked=91)
    assert holes.hole_at(T, 0) == 90
    assert holes.fetched(T, 0, 100, read_offset=99, now=0.0) is Verdict.SEEK
    assert holes.fetched(T, 0, 90, read_offset=90, now=0.1) is Verdict.PASS


def test_revoked_partitions_drop_their_holes() -> None:
    holes = Holes(frozenset({T}))
    holes.open(T, 0, 5, 9)
    holes.open(T, 1, 7, 9)
    holes.revoke({(T, 0)})
    assert list(holes.open_holes) == [(T, 1)]


def test_a_jump_seen_again_right_after_its_hole_filled_is_offsets_not_on_the_log() -> None:
    """Offset 55 absent (a topic compacted or written in transactions): 54 fetched again
    fills the hole, then the same jump 54 -> 56 is let through as faust's gap instead of
    opening the hole again for ever."""
    holes = Holes(frozenset({T}))
    assert holes.fetched(T, 0, 56, read_offset=54, now=0.0) is Verdict.SEEK
    assert holes.fetched(T, 0, 54, read_offset=54, now=0.1) is Verdict.PASS  # filled
    assert holes.fetched(T, 0, 56, read_offset=54, now=0.2) is Verdict.GAP
    assert holes.absent == 1 and holes.open_holes == {}
    assert holes.gap_accepted(T, 0, 56)
    assert holes.fetched(T, 0, 57, read_offset=56, now=0.3) is Verdict.PASS


def test_after_a_filled_hole_records_in_order_end_the_watch_for_that_jump() -> None:
    holes = Holes(frozenset({T}))
    assert holes.fetched(T, 1, 144, read_offset=113, now=0.0) is Verdict.SEEK
    for offset in (113, 114, 115):
        assert holes.fetched(T, 1, offset, read_offset=offset - 1, now=0.1) is Verdict.PASS
    assert holes.refilled == {}
    assert holes.fetched(T, 1, 144, read_offset=113, now=0.2) is Verdict.SEEK  # a new hole


def test_faust_records_no_gap_it_was_not_told_to() -> None:
    holes = Holes(frozenset({T}))
    assert not holes.gap_accepted(T, 0, 10)


def test_the_guard_wraps_the_faust_this_project_runs() -> None:
    """Every faust internal it wraps or calls exists (a faust upgrade that moves one shows
    here, not as a silent loss), and the wrappers are in place once enabled."""
    from faust.transport.consumer import Consumer

    faust_holes._patch_faust()
    assert faust_holes._patched
    for name in ("getmany", "_add_gap", "_new_offset"):
        assert getattr(Consumer, name).__qualname__.startswith("_patch_faust."), name


def test_a_record_given_up_does_not_hold_the_commit_again() -> None:
    """The log starts at committed + 1 (the committed record deleted): faust cannot record
    a one-record gap below its commit, so the head check must not reopen the hole there
    (it looped: the commit stayed put for good)."""
    holes = Holes(frozenset({T}), reseek_s=0.0, max_seeks=1)
    assert holes.fetched(T, 0, 41, read_offset=40, now=0.0) is Verdict.PASS  # 41 = 40 + 1
    assert holes.head_missing(T, 0, committed=40, first_acked=41)
    assert holes.fetched(T, 0, 42, read_offset=41, now=0.0) is Verdict.SEEK
    assert holes.fetched(T, 0, 41, read_offset=40, now=1.0) is Verdict.RELEASE
    assert holes.release(T, 0, 41, log_start=41) == 40
    assert holes.fetched(T, 0, 41, read_offset=41, now=1.1) is Verdict.PASS  # filled
    assert not holes.head_missing(T, 0, committed=40, first_acked=41)
    assert holes.open_holes == {}
