"""Audit replay: rebuild every projection from a log, and compare it with a live one.

- :func:`rebuild_from_log` folds an embedded log (``runwatch log export`` output) into a
  read model from scratch: the ``runwatch replay LOG`` command calls it.
- :func:`rebuild_from_backend` does the same over any :class:`events.log.base.LogBackend`
  (Kafka included): every partition of the input topics is read to its current end and
  merged by (append timestamp, topic, partition, offset).
- :func:`verify` replays from scratch *up to the positions* a durable read model says it
  has consumed and returns the first difference between the two projections (or None):
  ``runwatch audit verify`` prints it.

Replaying into a store that already holds those positions is a no-op (records before a
stored position are skipped), so a replay can be resumed or repeated safely.
"""

from __future__ import annotations

import gc
import heapq
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from events.envelope import EventBase
from events.log.base import LogBackend, Record
from projections.engine import INPUTS, ProjectionEngine
from projections.policy import Prices, RunStatePolicy
from projections.store import InMemoryReadModel, Positions, ReadModel

#: Records per read-model commit in a replay. A commit writes every run that changed
#: since the last one (its view and fold states: ~20 kB per run), so a bulk replay commits
#: rarely; a crash loses at most this many records of work, never correctness (positions
#: are committed with the views).
COMMIT_EVERY = 50_000


@dataclass
class ReplayResult:
    engine: ProjectionEngine
    derived: list[EventBase] = field(default_factory=list)
    records: int = 0
    seconds: float = 0.0

    @property
    def store(self) -> ReadModel:
        return self.engine.store

    def summary(self) -> dict[str, Any]:
        by_type: dict[str, int] = {}
        for ev in self.derived:
            by_type[ev.type] = by_type.get(ev.type, 0) + 1
        views = self.engine.views.values()
        states: dict[str, int] = {}
        for v in views:
            states[str(v.state)] = states.get(str(v.state), 0) + 1
        return {
            "records": self.records,
            "applied": self.engine.applied,
            "skipped_already_applied": self.engine.skipped,
            "dead_letters": len(self.engine.dead_letters),
            "runs": len(self.engine.views),
            "runs_by_state": dict(sorted(states.items())),
            "derived": dict(sorted(by_type.items())),
            "held_at_terminal_barrier": len(self.engine.held),
            "seconds": round(self.seconds, 3),
            "records_per_s": round(self.records / self.seconds) if self.seconds else None,
        }


def _chunks(it: Iterator[Record], n: int) -> Iterator[list[Record]]:
    while chunk := list(islice(it, n)):
        yield chunk


def topic_stops(until: Positions | None) -> dict[str, int] | None:
    """``until`` (``topic:0`` positions of an embedded log) as the per-topic stop offsets
    of :meth:`~events.log.embedded.EmbeddedLog.iter_records` (a topic not named: 0)."""
    if until is None:
        return None
    return {topic: until.get(f"{topic}:0", 0) for topic in INPUTS}


def _until(records: Iterator[Record], until: Positions | None) -> Iterator[Record]:
    if until is None:
        yield from records
        return
    for rec in records:
        if rec.offset < until.get(f"{rec.topic}:{rec.partition}", 0):
            yield rec


def _feed(
    engine: ProjectionEngine,
    records: Iterator[Record],
    *,
    force_release: bool,
    commit_every: int,
    collect: bool,
) -> ReplayResult:
    result = ReplayResult(engine)
    started = time.perf_counter()
    # The cyclic GC is paused for the replay: views, fold states and events form no
    # reference cycles (reference counting frees them), and the collector's repeated scans
    # of millions of live series points cost a third of the replay's CPU time.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for chunk in _chunks(records, commit_every):
            derived = engine.process(chunk)
            result.records += len(chunk)
            if collect:
                result.derived.extend(derived)
            engine.checkpoint()
        if force_release:
            derived = engine.release_held(force=True)
            if collect:
                result.derived.extend(derived)
        engine.checkpoint()
    finally:
        if gc_was_enabled:
            gc.enable()
    result.seconds = time.perf_counter() - started
    return result


def rebuild_from_log(
    log: str | os.PathLike[str] | Any,
    store: ReadModel | None = None,
    *,
    policy: RunStatePolicy | None = None,
    prices: Prices | None = None,
    until: Positions | None = None,
    force_release: bool = True,
    commit_every: int = COMMIT_EVERY,
    collect: bool = True,
) -> ReplayResult:
    """Fold an embedded log (a directory or an ``EmbeddedLog``) into ``store`` (default:
    a fresh in-memory read model). ``until``: stop each topic at that position."""
    from events.log.embedded import EmbeddedLog  # the embedded backend, only when replaying

    if not isinstance(log, EmbeddedLog):
        root = Path(log)
        if not root.is_dir():
            raise FileNotFoundError(f"no embedded log at {root}")
        log = EmbeddedLog(root, readonly=True)
    engine = ProjectionEngine(store or InMemoryReadModel(), policy, prices)
    starts = {k.rsplit(":", 1)[0]: v for k, v in engine.positions.items()}
    records = log.iter_records(list(INPUTS), from_offsets=starts, to_offsets=topic_stops(until))
    return _feed(
        engine, records, force_release=force_release, commit_every=commit_every, collect=collect
    )


async def rebuild_from_backend(
    backend: LogBackend,
    store: ReadModel | None = None,
    *,
    policy: RunStatePolicy | None = None,
    prices: Prices | None = None,
    until: Positions | None = None,
    force_release: bool = True,
    commit_every: int = COMMIT_EVERY,
) -> ReplayResult:
    """From-scratch replay of the input topics of any backend, read to their current end
    (or to ``until``), merged by (append timestamp, topic, partition, offset)."""
    streams: list[list[Record]] = []
    for topic in INPUTS:
        for partition in await backend.partitions(topic):
            records = [rec async for rec in backend.read(topic, partition, 0, until_end=True)]
            streams.append(list(_until(iter(records), until)))
    merged = heapq.merge(*streams, key=lambda r: (r.timestamp_ms, r.topic, r.partition, r.offset))
    engine = ProjectionEngine(store or InMemoryReadModel(), policy, prices)
    return _feed(
        engine, iter(merged), force_release=force_release, commit_every=commit_every, collect=True
    )


def replay_projections(
    log_dir: str | os.PathLike[str],
    store_path: str | os.PathLike[str] | None = None,
    policy_path: str | os.PathLike[str] | None = None,
    prices_path: str | os.PathLike[str] | None = None,
    workers: int = 1,
) -> ReplayResult:
    """What ``runwatch replay LOG [--store DB] [--workers N]`` runs for the projections:
    rebuild them from the log's recorded topics (alerts as the live detectors appended
    them) into a fresh in-memory model, or into the SQLite file ``store_path`` (resumable,
    idempotent). ``workers`` > 1: a key-sharded rebuild (:mod:`projections.sharded`) when
    the target is new; a store that already holds a projection resumes single-process."""
    from projections.store import SqliteReadModel

    policy, prices = RunStatePolicy.load(policy_path), Prices.load(prices_path)
    store = SqliteReadModel(store_path) if store_path else None
    if workers > 1 and (store is None or not store.positions()):
        from projections.sharded import rebuild_sharded

        if store is not None:
            store.close()
        return rebuild_sharded(log_dir, store_path, workers=workers, policy=policy, prices=prices)
    return rebuild_from_log(log_dir, store, policy=policy, prices=prices)


def first_difference(a: Any, b: Any, path: str = "$") -> tuple[str, Any, Any] | None:
    """The first place (depth-first, keys sorted) where two JSON-like values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{path}.{key}", a.get(key, "<missing>"), b.get(key, "<missing>")
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        if len(a) != len(b):
            return f"{path}.length", len(a), len(b)
        return None
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return None  # NaN == NaN for the audit
    return None if a == b else (path, a, b)


@dataclass
class Verification:
    difference: tuple[str, Any, Any] | None
    positions: Positions
    replay: ReplayResult

    @property
    def identical(self) -> bool:
        return self.difference is None


def verify(
    live: ReadModel,
    log: str | os.PathLike[str] | Any,
    *,
    policy: RunStatePolicy | None = None,
    prices: Prices | None = None,
    workers: int = 1,
) -> Verification:
    """Replay ``log`` from scratch up to ``live``'s consumed positions and compare.
    ``workers`` > 1: a key-sharded replay, unless the live projection still holds runs at
    the terminal barrier (the replay must hold them too: single-process)."""
    snapshot = live.load()
    positions = snapshot.positions
    still_held = bool((snapshot.held or {}).get("runs"))
    if workers > 1 and not still_held:
        from projections.sharded import rebuild_sharded

        replay = rebuild_sharded(
            log if isinstance(log, (str, os.PathLike)) else log.root,
            workers=workers,
            policy=policy,
            prices=prices,
            until=positions,
            collect=False,
        )
    else:
        replay = rebuild_from_log(
            log, policy=policy, prices=prices, until=positions, force_release=not still_held
        )
    return Verification(first_difference(live.export(), replay.store.export()), positions, replay)


async def verify_backend(
    live: ReadModel,
    backend: LogBackend,
    *,
    policy: RunStatePolicy | None = None,
    prices: Prices | None = None,
) -> Verification:
    """:func:`verify` for a projection fed from Kafka (or any backend): replay the
    backend's topics from offset 0 up to ``live``'s positions and compare."""
    snapshot = live.load()
    still_held = bool((snapshot.held or {}).get("runs"))
    replay = await rebuild_from_backend(
        backend,
        policy=policy,
        prices=prices,
        until=snapshot.positions,
        force_release=not still_held,
    )
    difference = first_difference(live.export(), replay.store.export())
    return Verification(difference, snapshot.positions, replay)
