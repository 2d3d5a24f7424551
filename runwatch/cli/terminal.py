"""The one terminal object every command prints through (hatch's ``cli/terminal.py`` idea).

Commands never call ``print``: they call ``term.info`` / ``term.table`` / ``term.json``.
Human text goes to stdout, diagnostics to stderr; ``--json`` output is one JSON document
(or one object per line for streams) on stdout and nothing else.

Much of what is printed is tenant-controlled (a reward function's exception, a run's
failure reason, a batch's prompt), so nothing reaches the terminal raw: every line of
human text has its control characters (ANSI escapes included: ESC and the one-byte CSI),
bidi overrides/isolates/marks and lone surrogates made visible and harmless
(:func:`sandbox.text.escape_controls`; ``\n`` and ``\t`` kept, and escaped inside a
table cell and in :meth:`Terminal.line`, one record per line), and JSON output escapes
everything non-ASCII.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import IO, Any

from sandbox.text import escape_controls


class Abort(Exception):
    """Stop the command: the message goes to stderr and the process exits ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


class Terminal:
    def __init__(self, out: IO[str] | None = None, err: IO[str] | None = None, verbose: int = 0):
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.verbose = verbose

    def info(self, message: str) -> None:
        self.out.write(_safe(message) + "\n")

    def line(self, message: str) -> None:
        """One record, one line: newlines and tabs escaped too (``\\n``), so tenant text in
        a record (a failure reason) cannot start a line that reads as another record."""
        self.out.write(escape_controls(str(message), oneline=True) + "\n")

    def progress(self, message: str) -> None:
        """Progress lines go to stderr so stdout stays parseable."""
        self.err.write(_safe(message) + "\n")
        self.err.flush()

    def warn(self, message: str) -> None:
        self.err.write(f"warning: {_safe(message)}\n")

    def error(self, message: str) -> None:
        self.err.write(f"error: {_safe(message)}\n")

    def debug(self, message: str) -> None:
        if self.verbose:
            self.err.write(f"debug: {_safe(message)}\n")

    def json(self, obj: Any) -> None:
        """One JSON document (pretty-printed is not needed: machines read this)."""
        self.out.write(json.dumps(obj, default=_json_default, allow_nan=True) + "\n")

    def table(self, rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> None:
        """A plain ASCII table; cells are ``str()``-ed, columns padded to fit."""
        cells = [[_cell(c) for c in columns]] + [[_cell(v) for v in row] for row in rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
        line = "+".join("-" * (w + 2) for w in widths)
        self.out.write("+" + line + "+\n")
        for n, row in enumerate(cells):
            self.out.write("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |\n")
            if n == 0:
                self.out.write("+" + line + "+\n")
        self.out.write("+" + line + "+\n")


def _safe(message: Any) -> str:
    return escape_controls(message if isinstance(message, str) else str(message))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return escape_controls(str(value), oneline=True)
