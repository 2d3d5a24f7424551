"""Tenant text made safe to carry (#20 item 3): pure."""

from __future__ import annotations

import json

import pytest

from sandbox.text import clean_text, escape_controls

EVIL = "\ud800" + "\x1b[31m" + "RED" + "\u202e" + "evil" + "\u2066x\u2069" + "\u200f" + "\x9b2J"


def test_lone_surrogates_controls_and_bidi_are_made_harmless() -> None:
    out = clean_text(EVIL + "\r\nnext\tline\x00\x7f\u2028\u061c")
    assert out == (
        "\ufffd\\x1b[31mRED\\u202eevil\\u2066x\\u2069\\u200f\\x9b2J\\x0d\nnext\tline"
        "\\x00\\x7f\\u2028\\u061c"
    )
    out.encode("utf-8")  # valid UTF-8 now
    json.dumps(out, ensure_ascii=False).encode("utf-8")
    assert "\x1b" not in out and "\x9b" not in out and "\u202e" not in out


def test_oneline_escapes_newlines_and_tabs_too() -> None:
    assert clean_text("a\nb\tc", oneline=True) == "a\\nb\\tc"
    assert escape_controls("a\nb") == "a\nb"


def test_plain_text_and_printable_unicode_pass_unchanged() -> None:
    text = "ValueError: bad answer for 'héllo' — 你好 👍 (x≤y)"
    assert clean_text(text) is text or clean_text(text) == text


@pytest.mark.parametrize("limit", [64, 300, 2000])
def test_bounded_keeping_head_and_tail(limit: int) -> None:
    text = "Traceback (most recent call last):\n" + "x" * 50_000 + "\nValueError: the end"
    out = clean_text(text, limit)
    assert len(out) <= limit
    assert out.startswith("Trace") and out.endswith("end")
    assert "characters cut]" in out


def test_bounding_never_splits_an_escape_and_is_idempotent() -> None:
    for n in range(1, 40):
        text = "\x1b" * 1000 + "y" * n
        out = clean_text(text, 100)
        assert len(out) <= 100
        head, _, tail = out.partition(" … [")
        tail = tail.split("] … ", 1)[1]
        assert head.replace("\\x1b", "") == "" and tail.rstrip("y").replace("\\x1b", "") == ""
        assert clean_text(out, 100) == out


def test_any_value_never_raises() -> None:
    class Bad:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert clean_text(Bad()) == "<unprintable Bad>"
    assert clean_text(None) == "None" and clean_text(3) == "3"
