"""Key-sharded parallel replay: a log's runs split across worker processes.

Every view and fold state here is per run; the fleet aggregates are commutative integer
sums; the one thing shared across runs is the terminal barrier's watermarks (per barrier
topic, moved by every run's records, see :mod:`projections.engine`). So an embedded log
can be rebuilt by ``workers`` processes, each folding the runs whose key hashes to it
(:func:`shard_of`: ``crc32(run_id) % workers``, the way Kafka spreads keys over
partitions), while reading the barrier topics whole so its watermarks move exactly as a
single engine's do (other runs' barrier facts are decoded but not applied). The parent
merges the shards' runs (disjoint) and sums the fleet aggregates. The result is the read
model a single-process replay builds, positions and watermarks included (tested).

Per record, a worker reads and checksums the whole log, decodes its own runs' records and
every barrier-topic record, and folds its own runs' only: with W free cores the wall time
is about read + barrier decode + (decode + fold) / W.

Two targets:

- in memory (``store_path=None``): each worker hands its runs back to the parent, which
  builds one :class:`~projections.store.InMemoryReadModel` and returns a
  :class:`~projections.replay.ReplayResult` like :func:`~projections.replay.rebuild_from_log`;
- SQLite: each worker writes a shard file; the parent merges them into the (new, empty)
  store with SQL in one transaction.

Assumptions:

- Records are keyed by their run id (``EventBase.key()``, what every producer here
  writes); a record without a key is placed by its decoded run id, and a record keyed by
  another run's id stops the rebuild with a clear error (replay it with one worker).
- A from-scratch rebuild (an empty target). Every worker reads the same range — the log's
  end offsets when the rebuild starts, or ``until`` — and the positions stored are where
  the readers stopped (a corrupt record ends a topic there, as in one process).
- Derived events come back merged by event time (stable by worker): for ``workers > 1``
  the interleaving of *different* runs' derived events can differ from a single-process
  replay; each run's own sequence is the same. Dead letters are listed shard by shard.
- Runs still held at the terminal barrier are released at the end, as the single-process
  replay does by default; a store that must keep them held is verified single-process.
- Shard 0 runs in the calling process, the others in forked children (``fork`` start
  method: call it from a process without threads of its own).
"""

from __future__ import annotations

import gc
import heapq
import json
import multiprocessing
import os
import sqlite3
import tempfile
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from events.codec import decode_or_raise, encode
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from projections.engine import BARRIER_TOPICS, INPUTS, ProjectionEngine
from projections.policy import Prices, RunStatePolicy
from projections.replay import COMMIT_EVERY, ReplayResult, _chunks, topic_stops
from projections.store import Batch, InMemoryReadModel, Positions, SqliteReadModel
from projections.views import Fleet


def shard_of(key: bytes | None, workers: int) -> int:
    """The worker that folds a record with this key (no key: worker 0)."""
    return zlib.crc32(key) % workers if key else 0


@dataclass(frozen=True)
class _Job:
    log_dir: str
    shard: int
    workers: int
    ends: dict[str, int]
    policy_json: str
    prices_json: str
    commit_every: int
    collect: bool
    #: the shard's SQLite file, or None to hand the runs back in memory
    sqlite_out: str | None


class _Passes(dict[bytes | None, bool]):
    """The read filter of a shard's own topics: key -> "may it be this shard's?", once per
    distinct key (``__getitem__`` is a C-level dict lookup per record). A record without
    a key passes (its run id decides after decoding)."""

    def __init__(self, shard: int, workers: int) -> None:
        super().__init__()
        self[None] = True
        self.shard, self.workers = shard, workers

    def __missing__(self, key: bytes | None) -> bool:
        mine = self[key] = shard_of(key, self.workers) == self.shard
        return mine


def _owns(shard: int, workers: int) -> Callable[[bytes | None], bool]:
    def owns(key: bytes | None) -> bool:
        return shard_of(key, workers) == shard

    return owns


def _run_shard(job: _Job) -> dict[str, Any]:
    """One worker: fold this shard's runs of the log, from offset 0 to ``job.ends``. It
    reads the barrier topics whole (other runs' records there move the barrier's
    watermarks) and the other topics filtered by key."""
    from events.log.embedded import EmbeddedLog

    gc_was_enabled = gc.isenabled()
    gc.disable()  # see projections.replay._feed for why
    try:
        log = EmbeddedLog(job.log_dir, readonly=True)
        store: InMemoryReadModel | SqliteReadModel = (
            InMemoryReadModel() if job.sqlite_out is None else SqliteReadModel(job.sqlite_out)
        )
        engine = ProjectionEngine(
            store,
            RunStatePolicy.model_validate_json(job.policy_json),
            Prices.model_validate_json(job.prices_json),
            owns=_owns(job.shard, job.workers),
        )
        passes = _Passes(job.shard, job.workers).__getitem__
        keys = {topic: passes for topic in INPUTS if topic not in BARRIER_TOPICS}
        reached: dict[str, int] = {}
        records = log.iter_records(list(INPUTS), keys=keys, to_offsets=job.ends, reached=reached)
        derived: list[bytes] = []
        for chunk in _chunks(records, job.commit_every):
            out = engine.process(chunk)
            if job.collect:
                derived += [encode(ev) for ev in out]
            engine.checkpoint()
        out = engine.release_held(force=True)
        if job.collect:
            derived += [encode(ev) for ev in out]
        engine.checkpoint()
        store.close()
        return {
            "applied": engine.applied,
            "rejected_foreign": engine.rejected_foreign,
            "dead_letters": engine.dead_letters,
            "fleet": engine.fleet.to_doc(),
            "watermarks": engine.watermarks,
            "reached": reached,
            "derived": derived,
            "runs": store.runs_contents() if isinstance(store, InMemoryReadModel) else None,
        }
    finally:
        if gc_was_enabled:
            gc.enable()


def merge_fleets(docs: list[dict[str, Any]]) -> Fleet:
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


def _end_offsets(log_dir: str | os.PathLike[str], until: Positions | None) -> dict[str, int]:
    from events.log.embedded import EmbeddedLog

    log = EmbeddedLog(log_dir, readonly=True)
    ends = {topic: log.end_offset_sync(topic) for topic in INPUTS}
    stops = topic_stops(until)
    return ends if stops is None else {t: min(e, stops[t]) for t, e in ends.items()}


def _run_jobs(jobs: list[_Job]) -> list[dict[str, Any]]:
    """Shard 0 in this process, the others in child processes at the same time (the
    caller's core works too, and one shard's results need no pickling)."""
    if len(jobs) == 1:
        return [_run_shard(jobs[0])]
    ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    with ProcessPoolExecutor(len(jobs) - 1, mp_context=ctx) as pool:
        others = [pool.submit(_run_shard, job) for job in jobs[1:]]
        first = _run_shard(jobs[0])
        return [first, *(f.result() for f in others)]


def rebuild_sharded(
    log_dir: str | os.PathLike[str],
    store_path: str | os.PathLike[str] | None = None,
    *,
    workers: int = 2,
    policy: RunStatePolicy | None = None,
    prices: Prices | None = None,
    until: Positions | None = None,
    commit_every: int = COMMIT_EVERY,
    collect: bool = True,
) -> ReplayResult:
    """:func:`projections.replay.rebuild_from_log` by ``workers`` processes: into a fresh
    in-memory read model, or into the new, empty SQLite store at ``store_path``.
    ``until``: stop each topic at that position."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    if not Path(log_dir).is_dir():
        raise FileNotFoundError(f"no embedded log at {log_dir}")
    if store_path is not None:
        target = SqliteReadModel(store_path)
        if target.positions():
            raise ValueError(f"{store_path} already holds a projection; resume it single-process")
        target.close()
    policy, prices = policy or RunStatePolicy.load(), prices or Prices.load()
    started = time.perf_counter()
    ends = _end_offsets(log_dir, until)
    with tempfile.TemporaryDirectory(
        dir=Path(store_path).parent if store_path is not None else None
    ) as tmp:
        files = [str(Path(tmp) / f"shard{i}.sqlite") for i in range(workers)]
        shard_files = files if store_path is not None else None
        policy_json, prices_json = policy.model_dump_json(), prices.model_dump_json()
        jobs = [
            _Job(
                str(log_dir),
                i,
                workers,
                ends,
                policy_json,
                prices_json,
                commit_every,
                collect,
                shard_files[i] if shard_files else None,
            )
            for i in range(workers)
        ]
        results = _run_jobs(jobs)
        fleet = merge_fleets([r["fleet"] for r in results])
        # where the readers stopped (every worker reads the same bytes; a bad record ends
        # a topic there, as in one process), and the barrier's (global) watermarks
        reached = {t: min(r["reached"].get(t, 0) for r in results) for t in INPUTS}
        positions = {f"{t}:0": n for t, n in reached.items() if n}
        watermarks: dict[str, float] = {}
        for r in results:
            for k, ts in r["watermarks"].items():
                watermarks[k] = max(ts, watermarks.get(k, ts))
        held = {"watermarks": watermarks, "runs": {}} if watermarks else {}
        if store_path is None:
            store: InMemoryReadModel | SqliteReadModel = InMemoryReadModel()
            for r in results:
                store.absorb_runs(r["runs"])
            store.commit(Batch(fleet=fleet, positions=positions, held=held))
        else:
            _merge_sqlite(store_path, files, fleet, positions, held)
            store = SqliteReadModel(store_path)
    engine = ProjectionEngine(store, policy, prices)
    engine.applied = sum(r["applied"] for r in results)
    engine.rejected_foreign = sum(r["rejected_foreign"] for r in results)
    dead: list[DeadLetter] = [d for r in results for d in r["dead_letters"]]
    engine.dead_letters = dead
    derived: list[EventBase] = []
    if collect:
        streams = [[decode_or_raise(raw) for raw in r["derived"]] for r in results]
        derived = list(heapq.merge(*streams, key=lambda ev: ev.ts))
    result = ReplayResult(engine, derived, records=sum(reached.values()))
    result.seconds = time.perf_counter() - started
    return result


def _merge_sqlite(
    store_path: str | os.PathLike[str],
    files: list[str],
    fleet: Fleet,
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
