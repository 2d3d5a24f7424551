"""The argparse type of a tenant or run id: refused at the command line, with the reason,
rather than by the first event the command builds (``events.identity.check_id``)."""

from __future__ import annotations

import argparse

from events.identity import check_id


def identifier(text: str) -> str:
    """``text`` if it is a valid tenant or run id, else argparse's usage error. An empty
    one is refused here too (an event may carry it; nobody means it on a command line)."""
    if not text:
        raise argparse.ArgumentTypeError("an id cannot be empty")
    try:
        return check_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text[:80]!r}: {exc}") from None
