"""The argparse type of a GPU count: refused at the command line, with the reason, rather
than by the first usage event the command builds (``producers.metrics_import.check_gpus``)."""

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
