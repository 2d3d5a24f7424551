"""Hand-built trace directories in seed 003's layout (``step_<N>/worker_<R>.jsonl``).

Tests describe requests by their times relative to a step's start (``T0`` + offsets) and
these helpers write the lines exactly as verl's ``SGLangLogManager`` does: a naive ISO
timestamp at the *end* of the event, ``event``, ``duration_sec``, ``extra``, ``workid``,
``step``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from events.catalog.rollout import RolloutTraceRecorded
from producers.trace_import import ImportReport, iter_trace_events

#: Unix time of the first step's start in every hand-built directory.
T0 = 1_754_950_000.0


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).replace(tzinfo=None).isoformat()


def line(
    step: int,
    worker: int,
    event: str,
    start: float,
    duration: float,
    extra: dict[str, Any] | None = None,
    **further: Any,
) -> str:
    """One verl trace line for an event that ran ``[start, start + duration]`` seconds
    after ``T0``."""
    entry: dict[str, Any] = {
        "timestamp": iso(T0 + start + duration),
        "event": event,
        "duration_sec": duration,
    }
    if extra is not None:
        entry["extra"] = extra
    entry["workid"] = worker
    entry["step"] = step
    entry.update(further)
    return json.dumps(entry)


def write_dir(root: Path, lines: list[str]) -> Path:
    """Write lines into ``root/step_<N>/worker_<R>.jsonl`` by their own step/workid."""
    files: dict[Path, list[str]] = {}
    for text in lines:
        obj = json.loads(text)
        path = root / f"step_{obj['step']}" / f"worker_{obj['workid']}.jsonl"
        files.setdefault(path, []).append(text)
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(content) + "\n")
    return root


def request(
    step: int, worker: int, rid: str, done_at: float, start: float = 0.0, **extra: Any
) -> str:
    """A one-event request that generated from ``start`` until ``done_at``."""
    return line(
        step, worker, "engine_async_generate", start, done_at - start, {"request_id": rid, **extra}
    )


def events_of(
    root: Path, run_id: str = "run-1", tenant_id: str = "acme"
) -> Iterator[RolloutTraceRecorded]:
    report = ImportReport()
    yield from iter_trace_events(root, run_id=run_id, tenant_id=tenant_id, report=report)
    assert not [i for i in report.issues if i.skipped], report.issues
