"""The CLI's terminal never passes control or bidi characters through (#20 item 3)."""

from __future__ import annotations

import io
import json

from runwatch.cli.terminal import Terminal

EVIL = "\ud800" + "\x1b[31m" + "RED" + "\u202e" + "evil" + "\u2066" + "\x9b2J" + "\r"
RAW = ("\x1b", "\x9b", "\u202e", "\u2066", "\r", "\ud800")


def test_every_human_channel_escapes_tenant_text() -> None:
    out, err = io.StringIO(), io.StringIO()
    term = Terminal(out, err, verbose=1)
    term.info(EVIL)
    term.progress(EVIL)
    term.warn(EVIL)
    term.error(EVIL)
    term.debug(EVIL)
    term.table([(EVIL, "a\nb", 1.5, None)], ["x\x1b", "y", "z", "w"])
    text = out.getvalue() + err.getvalue()
    assert not any(c in text for c in RAW)
    assert "\\x1b[31mRED\\u202eevil" in text and "\ufffd" in text
    assert "| a\\nb |" in out.getvalue()  # a cell stays on its row
    text.encode("utf-8")  # writable to any UTF-8 terminal (a lone surrogate was not)


def test_json_output_is_escaped_ascii() -> None:
    out = io.StringIO()
    Terminal(out, io.StringIO()).json({"message": EVIL})
    assert out.getvalue().isascii() and not any(c in out.getvalue() for c in RAW)
    assert json.loads(out.getvalue())["message"] == EVIL
