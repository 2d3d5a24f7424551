"""The argparse types of counts: refused at the command line, with the reason, rather than
deep inside the command (a GPU count by the first usage event it bills,
``producers.metrics_import.check_gpus``; a count of workers by a pool that never starts)."""

from __future__ import annotations

import argparse

from producers.metrics_import import check_gpus


def gpu_count(text: str) -> float:
    """``text`` as a finite number of GPUs above 0, else argparse's usage error."""
    try:
        value = check_gpus(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: {exc}") from None
    assert value is not None
    return value


def at_least_one(text: str) -> int:
    """``text`` as a whole number >= 1, else argparse's usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value
