"""Holes: records faust skipped after a seek are fetched again and folded in order."""

from __future__ import annotations

import pytest

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
    holes.open(T, 1, 50)
    assert holes.fetched(T, 1, 49, read_offset=60, now=0.0) is Verdict.PASS
    assert holes.fetched(T, 0, 900, read_offset=899, now=0.0) is Verdict.PASS
    assert holes.fetched(T, 1, 51, read_offset=60, now=0.0) is Verdict.SEEK


def test_a_hole_seeks_again_while_records_past_it_keep_coming() -> None:
    holes = Holes(frozenset({T}), reseek_s=0.5)
    holes.open(T, 2, 60)
    assert holes.fetched(T, 2, 70, read_offset=69, now=1.0) is Verdict.SEEK
    assert holes.fetched(T, 2, 71, read_offset=70, now=1.2) is Verdict.DROP
    assert holes.fetched(T, 2, 72, read_offset=71, now=1.6) is Verdict.SEEK


def test_an_open_hole_keeps_its_lower_start() -> None:
    holes = Holes(frozenset({T}))
    holes.open(T, 2, 60)
    holes.open(T, 2, 70)
    holes.open(T, 2, 55)
    assert holes.hole_at(T, 2) == 55


def test_a_hole_that_never_comes_back_is_given_up_loudly(caplog: pytest.LogCaptureFixture) -> None:
    holes = Holes(frozenset({T}), reseek_s=0.0, max_seeks=3)
    holes.open(T, 0, 10)
    verdicts = [holes.fetched(T, 0, 20 + i, read_offset=None, now=float(i)) for i in range(4)]
    assert verdicts == [Verdict.SEEK] * 3 + [Verdict.PASS]
    assert holes.given_up == 1 and holes.open_holes == {}
    assert "did not come back after 3 seeks" in caplog.text


def test_revoked_partitions_drop_their_holes() -> None:
    holes = Holes(frozenset({T}))
    holes.open(T, 0, 5)
    holes.open(T, 1, 7)
    holes.revoke({(T, 0)})
    assert list(holes.open_holes) == [(T, 1)]
