"""A key-sharded replay: the shards of :mod:`runwatch.hosting.shards` run at once, merged.

Every view and fold state is per run; the fleet aggregates are commutative integer sums;
the one thing shared across runs is the barrier's watermarks (global, so every shard reads
the barrier topics whole). So the parent merges the shards' runs (disjoint), sums the
fleet aggregates, takes the watermarks' maxima, the union of the runs still held at the
barrier and the positions where the readers stopped, and merges the derived events by
their tags: the read model and the derived events are what one process builds (tested).

Two targets: in memory (each worker hands its runs back; the parent builds one
:class:`~projections.store.InMemoryReadModel`), or a new SQLite file (each worker writes
a shard file; the parent merges them with SQL in one transaction: the store is either
empty or complete). Shard 0 runs in the calling process, the others in forked children.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from events.envelope import EventBase
from runwatch.hosting.read_model import INPUTS, read_model_host
from runwatch.hosting.result import Positions, ReplayResult, decode_tagged, topic_stops
from runwatch.hosting.shards import Job, child


def replay_sharded(
    job: Job, workers: int, store_path: str | os.PathLike[str] | None, until: Positions | None
) -> ReplayResult:
    """``job`` by ``workers`` processes, into memory or the new SQLite file ``store_path``."""
    from projections.sqlite_store import SqliteReadModel
    from projections.store import Batch, InMemoryReadModel

    if store_path is not None:
        target = SqliteReadModel(store_path)
        if target.positions():
            raise ValueError(f"{store_path} already holds a projection; resume it single-process")
        target.close()
    ends = _end_offsets(job, until)
    with tempfile.TemporaryDirectory(
        dir=Path(store_path).parent if store_path is not None else None
    ) as tmp:
        files = [str(Path(tmp) / f"shard{i}.sqlite") for i in range(workers)]
        jobs = [
            replace(
                job,
                shard=i,
                workers=workers,
                ends=ends,
                sqlite_out=files[i] if store_path is not None else None,
            )
            for i in range(workers)
        ]
        results = _run_jobs(jobs)
        if not job.projections:
            return _processors_only(job, results)
        fleet = merge_fleets([r["fleet"] for r in results])
        # where the readers stopped (every worker reads the same bytes; a bad record ends
        # a topic there, as in one process), and the barrier's (global) watermarks
        reached = {t: min(r["reached"].get(t, 0) for r in results) for t in INPUTS}
        positions = {f"{t}:0": n for t, n in reached.items() if n}
        watermarks: dict[str, float] = {}
        for r in results:
            for k, ts in r["watermarks"].items():
                watermarks[k] = max(ts, watermarks.get(k, ts))
        # the runs still held at the barrier (none after the forced release) are each
        # one shard's: their union is what one process holds
        held_runs = {rid: q for r in results for rid, q in r["held_runs"].items()}
        held = {"watermarks": watermarks, "runs": held_runs} if watermarks or held_runs else {}
        if store_path is None:
            store: Any = InMemoryReadModel()
            for r in results:
                store.absorb_runs(r["runs"])
            store.commit(Batch(fleet=fleet, positions=positions, held=held))
        else:
            _merge_sqlite(store_path, files, fleet, positions, held)
            store = SqliteReadModel(store_path)
    host = read_model_host(store, job.policy, job.prices)
    host.view.applied = sum(r["applied"] for r in results)  # type: ignore[union-attr]
    host.view.rejected_foreign = sum(r["rejected_foreign"] for r in results)  # type: ignore[union-attr]
    host.dead_letters = [d for r in results for d in r["projection_dead_letters"]]
    processed, derived = _derived(job, results)
    return ReplayResult(host, derived, processed, records=sum(reached.values()))


def _processors_only(job: Job, results: list[dict[str, Any]]) -> ReplayResult:
    processed, _ = _derived(job, results)
    return ReplayResult(None, [], processed, records=sum(r["records"] for r in results))


def _derived(
    job: Job, results: list[dict[str, Any]]
) -> tuple[list[tuple[str, list[EventBase]]], list[EventBase]]:
    """The shards' derived events in one process's order: each processor fold's, and the
    read model's."""
    processed: list[tuple[str, list[EventBase]]] = [(f.name, []) for f in job.processors]
    derived: list[EventBase] = []
    if not job.collect:
        return processed, derived
    for tag, ev in decode_tagged([r["tagged"] for r in results]):
        if tag[0] == 0:
            processed[tag[1]][1].append(ev)
        else:
            derived.append(ev)
    return processed, derived


def merge_fleets(docs: list[dict[str, Any]]) -> Any:
    from projections.views import Fleet

    out = Fleet()
    for doc in docs:
        f = Fleet.from_doc(doc)
        for phase, buckets in f.phase_buckets.items():
            mine = out.phase_buckets.setdefault(phase, [0] * len(buckets))
            out.phase_buckets[phase] = [a + b for a, b in zip(mine, buckets)]
        for name in (
            "phase_sum_us",
            "phase_count",
            "reward_samples",
            "alerts_fired",
            "alerts_resolved",
            "transitions",
            "events",
        ):
            target = getattr(out, name)
            for k, v in getattr(f, name).items():
                target[k] = target.get(k, 0) + v
        out.dead_letters += f.dead_letters
    return out


def _end_offsets(job: Job, until: Positions | None) -> dict[str, int]:
    """Every topic read, to its current end (the read model's: to ``until`` if given), so
    every worker reads the same range."""
    from events.log.embedded import EmbeddedLog

    log = EmbeddedLog(job.log_dir, readonly=True)
    topics = set(INPUTS) if job.projections else set()
    for fold in job.processors:
        topics.update(fold.inputs)
    ends = {topic: log.end_offset_sync(topic) for topic in sorted(topics)}
    stops = topic_stops(until)
    if stops is not None:
        ends.update({t: min(ends[t], stops[t]) for t in INPUTS})
    return ends


def _run_jobs(jobs: list[Job]) -> list[dict[str, Any]]:
    """Shard 0 in this process, the others in child processes at the same time (the
    caller's core works too, and one shard's results need no pickling)."""
    if len(jobs) == 1:
        return [child(jobs[0])]
    ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    with ProcessPoolExecutor(len(jobs) - 1, mp_context=ctx) as pool:
        others = [pool.submit(child, job) for job in jobs[1:]]
        first = child(jobs[0])
        return [first, *(f.result() for f in others)]


def _merge_sqlite(
    store_path: str | os.PathLike[str],
    files: list[str],
    fleet: Any,
    positions: Positions,
    held: dict[str, Any],
) -> None:
    """Copy the shard files' rows into the store, with the fleet and positions: one
    transaction (the store is either empty or complete)."""
    con = sqlite3.connect(store_path, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        for i, path in enumerate(files):
            con.execute(f"ATTACH DATABASE ? AS s{i}", (path,))
            for table in ("runs", "series", "fold_state"):
                con.execute(f"INSERT INTO main.{table} SELECT * FROM s{i}.{table}")
        fleet_doc = json.dumps(fleet.to_doc())
        con.execute("INSERT OR REPLACE INTO meta VALUES ('fleet', ?)", (fleet_doc,))
        con.execute("INSERT OR REPLACE INTO meta VALUES ('held', ?)", (json.dumps(held),))
        con.executemany("INSERT OR REPLACE INTO positions VALUES (?, ?)", sorted(positions.items()))
        con.execute("COMMIT")
        for i in range(len(files)):
            con.execute(f"DETACH DATABASE s{i}")
    finally:
        con.close()
