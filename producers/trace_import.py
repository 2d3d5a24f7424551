"""Import verl multi-turn rollout traces (seed 003's layout, as it is) into the log.

Layout: ``DIR/step_<N>/worker_<R>.jsonl``; every line is one JSON object written by
verl's ``SGLangLogManager.log`` at the *end* of a timed event::

    {"timestamp": "2025-08-11T23:19:45.001989", "event": "aborted_request_with_cancelled_error",
     "duration_sec": 84.51, "extra": {"request_id": "45bb…"}, "workid": 2, "step": 4}

Each good line becomes one :class:`~events.catalog.rollout.RolloutTraceRecorded`:

- ``ts`` = ``timestamp`` (ISO 8601; a naive timestamp - verl writes ``datetime.now()`` -
  is read as UTC: the profile only uses differences, so the zone does not matter; a
  number is taken as unix seconds); ``started_at`` = ``ts - duration_sec``.
- ``event_name`` = ``event``; ``duration_s`` = ``duration_sec`` (required, finite, >= 0).
- ``worker`` = ``workid`` and ``step`` = ``step``, each taken from the path when the line
  lacks it (a line that disagrees with its path is kept and reported as a warning).
- Known keys, looked up in ``extra`` and then among the line's further keys, fill the
  typed fields: ``request_id``/``req_id``, ``turn``/``turn_id``, ``prompt_tokens``,
  ``completion_tokens``/``output_tokens``/``response_length``, ``finish_reason``,
  ``aborted``, ``unparseable``/``parse_error``, ``policy_version``. An event whose name
  starts with ``aborted`` is ``aborted`` (verl's over-sampling cancellations).
- Everything else of ``extra`` and every further key lands in ``extra`` (lists and
  objects as JSON text), so nothing the line said is lost.

Bad lines never crash the import and never vanish silently: bad JSON, a non-object,
a missing or mistyped required field, a bad timestamp, a negative or non-finite
duration each skip the line and are reported with file and line number
(:class:`ImportIssue`); the import goes on.

Ids are deterministic (uuid5 of run, file and line), so importing the same directory
twice yields the same events, which every consumer deduplicates. ``seq`` is the line's
index over the whole import, so skipped lines show as gaps. Files are streamed line by
line and events are written in batches (``batch_size``) to the sink.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from events.catalog.rollout import RolloutTraceRecorded
from events.envelope import RUNWATCH_NAMESPACE, EventBase

PRODUCER = "trace-import"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_WORKER_FILE = re.compile(r"^worker_(\d+)\.jsonl$")
_REQUIRED = ("timestamp", "event", "duration_sec")
_KNOWN: dict[str, tuple[str, ...]] = {
    "request_id": ("request_id", "req_id"),
    "turn": ("turn", "turn_id", "turn_idx"),
    "prompt_tokens": ("prompt_tokens", "input_tokens"),
    "completion_tokens": ("completion_tokens", "output_tokens", "response_length"),
    "finish_reason": ("finish_reason",),
    "aborted": ("aborted",),
    "unparseable": ("unparseable", "parse_error"),
    "policy_version": ("policy_version",),
}
_ALIAS = {alias: target for target, aliases in _KNOWN.items() for alias in aliases}
_SCALARS = frozenset({str, int, float, bool})
_INT_FIELDS = frozenset({"turn", "prompt_tokens", "completion_tokens", "policy_version"})
_BOOL_FIELDS = frozenset({"aborted", "unparseable"})
_STR_FIELDS = frozenset({"request_id", "finish_reason"})
_ENVELOPE_KEYS = frozenset({"timestamp", "event", "duration_sec", "extra", "workid", "step"})


@dataclass(frozen=True, slots=True)
class ImportIssue:
    """One problem with one line (``line`` 0: with the file itself). ``skipped``: the
    line was not imported (an error); otherwise it was imported and this is a warning."""

    path: str
    line: int
    kind: str
    message: str
    skipped: bool = True

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.message}"


@dataclass
class ImportReport:
    """What an import read, wrote and refused. Only the first ``max_issues`` issues are
    kept in full; ``issue_counts`` counts every one by kind."""

    files: int = 0
    lines: int = 0
    imported: int = 0
    skipped: int = 0
    issues: list[ImportIssue] = field(default_factory=list)
    issue_counts: dict[str, int] = field(default_factory=dict)
    max_issues: int = 1000

    def add(self, issue: ImportIssue) -> None:
        self.issue_counts[issue.kind] = self.issue_counts.get(issue.kind, 0) + 1
        if issue.skipped and issue.line > 0:
            self.skipped += 1
        if len(self.issues) < self.max_issues:
            self.issues.append(issue)

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "lines": self.lines,
            "imported": self.imported,
            "skipped": self.skipped,
            "issue_counts": dict(sorted(self.issue_counts.items())),
            "issues": [
                {
                    "path": i.path,
                    "line": i.line,
                    "kind": i.kind,
                    "message": i.message,
                    "skipped": i.skipped,
                }
                for i in self.issues
            ],
        }


class _Bad(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def find_trace_files(
    root: str | os.PathLike[str], report: ImportReport | None = None
) -> list[tuple[int, int, Path]]:
    """``(step, worker, path)`` of every ``step_<N>/worker_<R>.jsonl`` under ``root``,
    in step then worker order. Other entries are reported (as warnings) and left alone.

    Raises ``FileNotFoundError`` when ``root`` is not a directory and ``ValueError`` when
    it holds no trace file, each with a message naming the expected layout.
    """
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(f"{base} is not a directory of step_<N>/worker_<R>.jsonl traces")
    found: list[tuple[int, int, Path]] = []
    for step_dir in base.iterdir():
        m = _STEP_DIR.match(step_dir.name)
        if not m or not step_dir.is_dir():
            if report is not None and not step_dir.name.startswith("."):
                report.add(
                    ImportIssue(
                        str(step_dir),
                        0,
                        "unexpected_entry",
                        "not a step_<N> directory; ignored",
                        skipped=False,
                    )
                )
            continue
        for path in step_dir.iterdir():
            w = _WORKER_FILE.match(path.name)
            if w and path.is_file():
                found.append((int(m.group(1)), int(w.group(1)), path))
            elif report is not None and not path.name.startswith("."):
                report.add(
                    ImportIssue(
                        str(path),
                        0,
                        "unexpected_entry",
                        "not a worker_<R>.jsonl file; ignored",
                        skipped=False,
                    )
                )
    if not found:
        raise ValueError(
            f"no trace files under {base}: expected step_<N>/worker_<R>.jsonl "
            "(seed 003's layout, e.g. logs/<experiment>/step_1/worker_0.jsonl)"
        )
    found.sort()
    return found


_EPOCH = datetime(1970, 1, 1)


def _timestamp(value: Any) -> float:
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value)
        except ValueError:
            raise _Bad("bad_timestamp", f"timestamp {value[:60]!r} is not ISO 8601") from None
        if dt.tzinfo is None:  # verl's datetime.now(): read as UTC
            return (dt - _EPOCH).total_seconds()
        return dt.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise _Bad("bad_timestamp", f"timestamp {value!r} is neither ISO 8601 text nor unix seconds")


def _int_like(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _scalar(value: Any) -> str | int | float | bool | None:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _typed(name: str, value: Any) -> Any:
    """The value as the typed field wants it, or raise ``_Bad('bad_field')``."""
    if name in _INT_FIELDS:
        out = _int_like(value)
        if out is None or out < 0:
            raise _Bad("bad_field", f"{name} {value!r} is not a non-negative integer")
        return out
    if name in _BOOL_FIELDS:
        if isinstance(value, bool):
            return value
        if name == "unparseable" and isinstance(value, str):
            return bool(value)  # parse_error: "<message>" means unparseable
        raise _Bad("bad_field", f"{name} {value!r} is not a boolean")
    if value is None or isinstance(value, (dict, list)):
        raise _Bad("bad_field", f"{name} {value!r} is not a scalar")
    return str(value)


def parse_line(
    obj: Any, *, step: int, worker: int, warnings: list[tuple[str, str]]
) -> dict[str, Any]:
    """The payload fields of one decoded line (``step`` and ``ts`` included, the other
    envelope fields not), each checked and typed exactly as the event wants it, or raise
    ``_Bad``. ``step``/``worker`` come from the path; kept oddities go to ``warnings``."""
    if type(obj) is not dict:
        raise _Bad("not_an_object", f"expected a JSON object, got {type(obj).__name__}")
    if "timestamp" not in obj or "event" not in obj or "duration_sec" not in obj:
        missing = [k for k in _REQUIRED if k not in obj]
        raise _Bad("missing_field", f"missing {', '.join(missing)}")
    name = obj["event"]
    if type(name) is not str or not name:
        raise _Bad("bad_field", f"event {name!r} is not a non-empty string")
    dur = obj["duration_sec"]
    if type(dur) is not float and (type(dur) is not int):
        raise _Bad("bad_field", f"duration_sec {dur!r} is not a number")
    if not math.isfinite(dur):
        raise _Bad("bad_duration", f"duration_sec {dur!r} is not finite")
    if dur < 0:
        raise _Bad("negative_duration", f"duration_sec {dur!r} is negative")
    dur = float(dur)
    ts = _timestamp(obj["timestamp"])
    line_step = obj.get("step")
    if line_step is None:
        line_step = step
    elif type(line_step) is not int:
        value = _int_like(line_step)
        if value is None:
            raise _Bad("bad_field", f"step {line_step!r} is not an integer")
        line_step = value
    line_worker = obj.get("workid")
    if line_worker is None:
        line_worker = worker
    elif type(line_worker) is not int:
        value = _int_like(line_worker)
        if value is None:
            raise _Bad("bad_field", f"workid {line_worker!r} is not an integer")
        line_worker = value
    if line_step != step:
        warnings.append(
            (
                "path_mismatch",
                f"step {line_step} but the file is under step_{step}; the line's value is used",
            )
        )
    if line_worker != worker:
        warnings.append(
            (
                "path_mismatch",
                f"workid {line_worker} but the file is "
                f"worker_{worker}.jsonl; the line's value is used",
            )
        )
    fields: dict[str, Any] = {
        "step": line_step,
        "ts": ts,
        "worker": str(line_worker),
        "event_name": name,
        "duration_s": dur,
        "started_at": ts - dur,
    }
    extra_in = obj.get("extra")
    if type(extra_in) is dict:
        merged = dict(extra_in)
    else:
        merged = {} if extra_in is None else {"extra": extra_in}
    if len(obj) > 3:
        for k, v in obj.items():
            if k not in _ENVELOPE_KEYS and k not in merged:
                merged[k] = v
    extra: list[tuple[str, Any]] = []
    for k, v in merged.items():
        target = _ALIAS.get(k)
        if target is not None and target not in fields:
            kind = type(v)
            if (kind is str and target in _STR_FIELDS) or (
                kind is int and v >= 0 and target in _INT_FIELDS
            ):  # the common, already well-typed case
                fields[target] = v
                continue
            try:
                fields[target] = _typed(target, v)
                continue
            except _Bad as exc:
                warnings.append((exc.kind, f"{exc}; kept in extra"))
        extra.append((k, v if v is None or type(v) in _SCALARS else _scalar(v)))
    if extra:
        extra.sort()
        fields["extra"] = tuple(extra)
    if name.startswith("aborted"):
        fields["aborted"] = True
    return fields


def iter_trace_events(
    root: str | os.PathLike[str],
    *,
    run_id: str,
    tenant_id: str,
    report: ImportReport,
    producer: str = PRODUCER,
) -> Iterator[RolloutTraceRecorded]:
    """Stream the events of every good line under ``root`` (see the module doc); every
    refused line is added to ``report`` and skipped."""
    base = Path(root)
    seq = 0
    build = RolloutTraceRecorded  # validated: cheap once fields arrive typed and sorted
    decode = json.JSONDecoder().decode  # json.loads minus its per-call overhead
    warnings: list[tuple[str, str]] = []
    for step, worker, path in find_trace_files(base, report):
        report.files += 1
        ids = _LineIds(producer, run_id, path.relative_to(base).as_posix())
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                seq += 1
                if raw.isspace() or not raw:
                    continue
                report.lines += 1
                try:
                    try:
                        obj = decode(raw.decode())
                    except ValueError as exc:
                        raise _Bad("bad_json", f"not valid JSON: {exc}") from None
                    fields = parse_line(obj, step=step, worker=worker, warnings=warnings)
                    event = build(
                        event_id=ids.of(lineno),
                        tenant_id=tenant_id,
                        run_id=run_id,
                        producer=producer,
                        seq=seq - 1,
                        **fields,
                    )
                except _Bad as exc:
                    report.add(ImportIssue(str(path), lineno, exc.kind, str(exc)))
                    warnings.clear()
                    continue
                except ValueError as exc:  # pydantic: a value the event refuses
                    report.add(ImportIssue(str(path), lineno, "invalid", str(exc)[:300]))
                    warnings.clear()
                    continue
                if warnings:
                    for kind, message in warnings:
                        report.add(ImportIssue(str(path), lineno, kind, message, skipped=False))
                    warnings.clear()
                report.imported += 1
                yield event


class _LineIds:
    """``derived_id(producer, run_id, rel, lineno)`` of every line of one file, computed
    from one hashed prefix (uuid5 = SHA-1 of namespace + name, version bits set)."""

    __slots__ = ("_prefix",)

    def __init__(self, producer: str, run_id: str, rel: str) -> None:
        self._prefix = hashlib.sha1(
            RUNWATCH_NAMESPACE.bytes + f"{producer}|{run_id}|{rel}|".encode(),
            usedforsecurity=False,
        )

    def of(self, lineno: int) -> uuid.UUID:
        h = self._prefix.copy()
        h.update(str(lineno).encode())
        return uuid.UUID(bytes=h.digest()[:16], version=5)


def import_traces(
    root: str | os.PathLike[str],
    *,
    run_id: str,
    tenant_id: str,
    write: Callable[[Sequence[EventBase]], object],
    batch_size: int = 4096,
    report: ImportReport | None = None,
) -> ImportReport:
    """Import ``root`` into a sink: ``write`` (e.g. ``EmbeddedSink(dir).write``) gets the
    events in batches of ``batch_size``, in file order. Returns what happened."""
    report = report if report is not None else ImportReport()
    batch: list[EventBase] = []
    for event in iter_trace_events(root, run_id=run_id, tenant_id=tenant_id, report=report):
        batch.append(event)
        if len(batch) >= batch_size:
            write(batch)
            batch = []
    if batch:
        write(batch)
    return report
