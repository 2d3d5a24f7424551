"""A live metric dict -> the events ``runwatch import metrics`` would write for that row.

The key mapping is the importer's (:func:`producers.metrics_import.emit_row`): TRL's
``reward`` / ``kl`` / ``entropy`` / ``completions/*``, verl's ``critic/*`` / ``actor/*`` /
``response_length/*`` / ``timing_s/*`` / ``perf/*`` / ``val-core/*`` fill the same fields,
every other key is kept under its own name in ``extra``. What differs from a file import:

- values come from a live framework: numpy / torch scalars are read with ``.item()``,
  arrays and containers are kept as JSON text, anything else as ``str()``;
- a row that is *only* held-out evaluation (TRL ``eval_*`` keys, verl ``val-core/*``,
  ``val-aux/*``, ``val/*``, as both log them at their own call) yields its
  ``EvalGateScored`` and no ``TrainerStepCompleted``: it is not an optimizer step;
- a framework's end-of-training summary (``train_runtime``, ``train_loss``, ...) yields
  nothing (the lifecycle event ``RunCompleted`` is the hook's own).

Pure: no clock, no I/O; the caller stamps the envelope.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from events.envelope import EventBase
from producers.metrics_import import MetricsImportReport, emit_row, row_kind

#: (event class, step, ts, kind, payload) -- what :func:`row_events` returns per event.
Planned = tuple[type[EventBase], int | None, float, str, dict[str, Any]]


def scalar(value: Any) -> Any:
    """A metric value as an event scalar (str, int, float, bool or None)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return scalar(item())  # numpy / torch scalars, one-element arrays and tensors
        except (ValueError, RuntimeError, TypeError):
            pass  # more than one element
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        value = tolist()
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def normalized(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``metrics`` with string keys and scalar values."""
    return {str(k): scalar(v) for k, v in metrics.items()}


def row_events(
    row: Mapping[str, Any],
    *,
    step: int,
    ts: float,
    algorithm: str,
    gpus: float | None = None,
    report: MetricsImportReport | None = None,
) -> list[Planned]:
    """The events of one logged row (already :func:`normalized`), in emission order."""
    report = report if report is not None else MetricsImportReport()
    planned: list[Planned] = []

    def emit(cls: type[EventBase], at: int | None, when: float, kind: str, **payload: Any):
        planned.append((cls, at, when, kind, payload))

    kind = row_kind(row)
    if kind in ("summary", "empty"):
        return planned
    emit_row(emit, dict(row), step, ts, algorithm, gpus, report)
    if kind == "eval":
        planned = [p for p in planned if p[0].__name__ == "EvalGateScored"]
    return planned
