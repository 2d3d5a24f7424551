"""The one replay path: every fold rebuilt from a log, by one process or key-sharded.

:func:`replay_log` reads an embedded log (``runwatch log export`` output) once, decodes
each record once, and feeds the processors' folds (what they derive is collected, nothing
is written) and the read model's host (into a fresh in-memory model, or a SQLite file:
resumable, and a replay into a store that already holds the log's positions is a no-op).
``workers`` > 1 splits the runs across worker processes by key (:mod:`runwatch.hosting.
shards`): shard 0 in this process, the others forked; the parent merges their runs
(disjoint) and sums the fleet aggregates. Whatever ``workers``, the result is the same:
the read model (positions and watermarks included) and the derived events in the same
order (tested).

:func:`rebuild_from_backend` does the read model's part over any
:class:`events.log.base.LogBackend` (Kafka included): every partition of its topics read
to its current end and merged by (append timestamp, topic, partition, offset).

The read model reads the records as they are on the log: the alerts the live detectors
appended, not the ones the replay's detectors derive again. (Both are the same events when
the log holds the detectors' output; the replay prints its own so they can be compared.)

Assumptions of a key-sharded replay: records are keyed by their run id (a record keyed by
another run's id stops it with a clear error: replay it with one worker); an empty target
(a store that already holds a projection resumes in one process); forked workers (``fork``
start method: call it from a process without threads of its own).
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from events.envelope import EventBase
from events.fold import Fold
from events.log.base import LogBackend, Record
from runwatch.hosting.read_model import INPUTS, read_model_host
from runwatch.hosting.result import Positions, ReplayResult, from_shard, topic_stops
from runwatch.hosting.shards import Job, run_shard

#: Records per read-model commit in a replay. A commit writes every run that changed
#: since the last one (its view and fold states: ~20 kB per run), so a bulk replay commits
#: rarely; a crash loses at most this many records of work, never correctness (positions
#: are committed with the views).
COMMIT_EVERY = 50_000


def replay_log(
    log: str | os.PathLike[str] | Any,
    *,
    processors: Sequence[Fold[Any]] = (),
    projections: bool = True,
    store: Any = None,
    store_path: str | os.PathLike[str] | None = None,
    policy: Any = None,
    prices: Any = None,
    workers: int = 1,
    until: Positions | None = None,
    force_release: bool = True,
    commit_every: int = COMMIT_EVERY,
    collect: bool = True,
) -> ReplayResult:
    """Replay ``log`` (a directory or an ``EmbeddedLog``): the ``processors``' folds (what
    they derive is collected when ``collect``) and, with ``projections``, the read model —
    into ``store`` (a :class:`~projections.store.ReadModel`), the SQLite file
    ``store_path``, or a fresh in-memory model. ``until``: stop each topic at that
    position. ``workers`` > 1: key-sharded, into a new target only."""
    root = _root(log)
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    if store is not None and store_path is not None:
        raise ValueError("give a store or a store path, not both")
    if store is not None and workers > 1:
        raise ValueError("a key-sharded replay builds a new store: give a store path")
    from projections.sqlite_store import SqliteReadModel
    from stream_processors.accounting import Prices

    started = time.perf_counter()
    policy, prices = _policy(policy), prices if isinstance(prices, Prices) else Prices.load(prices)
    job = Job(
        str(root),
        tuple(processors),
        projections,
        policy,
        prices,
        commit_every=commit_every,
        collect=collect,
        force_release=force_release,
    )
    if workers > 1:
        from runwatch.hosting.sharded import replay_sharded

        result = replay_sharded(job, workers, store_path, until)
    else:
        if store is None and store_path is not None:
            store = SqliteReadModel(store_path)
        ends = _ends(root, until, job)
        shard = run_shard(_with(job, ends=ends), store)
        result = from_shard(shard)
    result.seconds = time.perf_counter() - started
    return result


def replay_processors(
    log: str | os.PathLike[str] | Any, folds: Sequence[Fold[Any]], workers: int = 1
) -> list[EventBase]:
    """What ``folds`` derive from ``log``, fold by fold (nothing is written)."""
    return replay_log(log, processors=folds, projections=False, workers=workers).processor_events()


def rebuild_from_log(
    log: str | os.PathLike[str] | Any,
    store: Any = None,
    *,
    policy: Any = None,
    prices: Any = None,
    until: Positions | None = None,
    force_release: bool = True,
    commit_every: int = COMMIT_EVERY,
    collect: bool = True,
    workers: int = 1,
) -> ReplayResult:
    """The read model alone, rebuilt from an embedded log (:func:`replay_log`)."""
    return replay_log(
        log,
        store=store,
        policy=policy,
        prices=prices,
        until=until,
        force_release=force_release,
        commit_every=commit_every,
        collect=collect,
        workers=workers,
    )


async def rebuild_from_backend(
    backend: LogBackend,
    store: Any = None,
    *,
    policy: Any = None,
    prices: Any = None,
    until: Positions | None = None,
    force_release: bool = True,
    commit_every: int = COMMIT_EVERY,
) -> ReplayResult:
    """From-scratch replay of the read model's topics of any backend, read to their
    current end (or to ``until``), merged by (append timestamp, topic, partition, offset)."""
    streams: list[list[Record]] = []
    for topic in INPUTS:
        for partition in await backend.partitions(topic):
            stop = None if until is None else until.get(f"{topic}:{partition}", 0)
            records = [rec async for rec in backend.read(topic, partition, 0, until_end=True)]
            streams.append([r for r in records if stop is None or r.offset < stop])
    merged = list(
        heapq.merge(*streams, key=lambda r: (r.timestamp_ms, r.topic, r.partition, r.offset))
    )
    host = read_model_host(store, _policy(policy), prices)
    result = ReplayResult(host)
    started = time.perf_counter()
    for i in range(0, len(merged), commit_every):
        chunk = merged[i : i + commit_every]
        result.derived.extend(host.process(chunk))
        result.records += len(chunk)
        host.checkpoint()
    if force_release:
        result.derived.extend(host.release_held(force=True))
    host.checkpoint()
    result.seconds = time.perf_counter() - started
    return result


# -- pieces --------------------------------------------------------------------------------


def _root(log: Any) -> Path:
    root = Path(log) if isinstance(log, (str, os.PathLike)) else Path(log.root)
    if not root.is_dir():
        raise FileNotFoundError(f"no embedded log at {root}")
    return root


def _policy(policy: Any) -> Any:
    from projections.policy import RunStatePolicy

    return policy if policy is not None else RunStatePolicy.load()


def _with(job: Job, **changes: Any) -> Job:
    from dataclasses import replace

    return replace(job, **changes)


def _ends(root: Path, until: Positions | None, job: Job) -> dict[str, int] | None:
    """Where each topic stops: ``until``'s positions for the read model's topics (the
    processors' own topics, if any, to the end)."""
    stops = topic_stops(until)
    if stops is None:
        return None
    if job.processors:
        from events.log.embedded import EmbeddedLog

        log = EmbeddedLog(root, readonly=True)
        for fold in job.processors:
            for topic in fold.inputs:
                stops.setdefault(topic, log.end_offset_sync(topic))
    return stops
