"""The gateway's sealed read cursors, and how a hook's client numbers what it is shown.

A cursor must hide its offset (a tenant could otherwise count the other tenants' records
between two of its reads), open only for the tenant, topic and partition it was made for,
and never crash the gateway on garbage; the client's numbers must stay the same when a
scan starts over from the beginning (a gateway restarted with a new secret).
"""

from __future__ import annotations

import base64

import pytest

from producers.hooks.gateway import _Shown
from runwatch.apps.ingest_cursor import CursorRefused, CursorSeal

WHERE = ("tenant-a", "runwatch.control", 0)


def test_a_cursor_opens_to_its_offset_and_hides_it() -> None:
    seal = CursorSeal()
    for offset in (0, 1, 7, 123_456_789, 2**63):
        cursor = seal.seal(offset, *WHERE)
        assert seal.open(cursor, *WHERE) == offset
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        assert offset.to_bytes(8, "big") not in raw  # not there in plain
    a, b = seal.seal(5, *WHERE), seal.seal(5, *WHERE)
    assert a != b and len(a) == len(b)  # the same offset twice: two unrelated cursors
    assert len({len(seal.seal(o, *WHERE)) for o in (0, 10**6, 2**40)}) == 1


@pytest.mark.parametrize(
    "elsewhere",
    [
        ("tenant-b", "runwatch.control", 0),
        ("tenant-a", "runwatch.lifecycle", 0),
        ("tenant-a", "runwatch.control", 1),
    ],
)
def test_a_cursor_opens_nowhere_else(elsewhere: tuple[str, str, int]) -> None:
    seal = CursorSeal()
    with pytest.raises(CursorRefused):
        seal.open(seal.seal(3, *WHERE), *elsewhere)


def test_a_forged_or_foreign_cursor_is_refused_not_a_crash() -> None:
    seal = CursorSeal(b"s" * 32)
    good = seal.seal(3, *WHERE)
    flipped = good[:12] + ("A" if good[12] != "A" else "B") + good[13:]
    for bad in ("", "x", "!!!!", "a" * 65, good[:-1], flipped, "\u00e9" * 10):
        with pytest.raises(CursorRefused):
            seal.open(bad, *WHERE)
    with pytest.raises(CursorRefused, match="new secret"):  # another gateway's secret
        CursorSeal(b"t" * 32).open(good, *WHERE)
    assert CursorSeal(b"s" * 32).open(good, *WHERE) == 3  # replicas sharing the secret
    with pytest.raises(ValueError):
        CursorSeal(b"short")
    with pytest.raises(ValueError):
        seal.seal(-1, *WHERE)


def test_the_client_numbers_what_it_is_shown_and_a_fresh_scan_shows_nothing_twice() -> None:
    shown = _Shown()
    for value in (b"a", b"b", b"c"):
        shown.add("t", 0, None, value, 0)
    assert [(r.offset, r.value) for r in shown.kept] == [(0, b"a"), (1, b"b"), (2, b"c")]
    shown.let_go(2)  # a reader went on from 2
    assert [r.offset for r in shown.kept] == [2] and shown.kept_from == 2
    shown.restart()  # the cursor no longer opens: the same records again, then a new one
    for value in (b"a", b"b", b"c", b"d"):
        shown.add("t", 0, None, value, 0)
    assert [(r.offset, r.value) for r in shown.kept] == [(2, b"c"), (3, b"d")]
    assert shown.count == 4 and shown.cursor is None
