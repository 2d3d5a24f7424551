"""Key-sharded parallel replay: a log's runs split across worker processes.

Every projection here is per run, except the fleet aggregates, which are commutative
integer sums. So an embedded log can be rebuilt by ``workers`` processes, each folding
the runs whose key hashes to it (``crc32(run_id) % workers``, the way Kafka spreads keys
over partitions) into a shard SQLite file of its own; the parent then merges the shards
with SQL and sums the fleet aggregates. Every worker still reads the whole log (reading
is cheap: no decoding of records that are not its own). The result is the same read
model a single-process replay builds (tested), in a fraction of the time on a multi-core
machine.

Only for a from-scratch rebuild into an empty store; resuming a store goes through the
single-process :func:`projections.replay.rebuild_from_log`.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sqlite3
import tempfile
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from projections.engine import INPUTS, ProjectionEngine
from projections.policy import Prices, RunStatePolicy
from projections.store import SqliteReadModel
from projections.views import Fleet


def _shard(job: tuple[str, int, int, str, str, str, int]) -> dict[str, Any]:
    from events.log.embedded import EmbeddedLog
    from projections.replay import _chunks

    log_dir, shard, workers, out, policy_json, prices_json, commit_every = job
    gc.disable()  # a dedicated worker; see projections.replay._feed for why
    log = EmbeddedLog(log_dir, readonly=True)
    engine = ProjectionEngine(
        SqliteReadModel(out),
        RunStatePolicy.model_validate_json(policy_json),
        Prices.model_validate_json(prices_json),
    )
    ends: dict[str, int] = {}
    crc32 = zlib.crc32

    def mine():  # type: ignore[no-untyped-def]
        for rec in log.iter_records(list(INPUTS)):
            ends[rec.topic] = rec.offset + 1
            if (crc32(rec.key) % workers if rec.key else 0) == shard:
                yield rec

    for chunk in _chunks(mine(), commit_every):
        engine.process(chunk)
        engine.checkpoint()
    engine.release_held(force=True)
    engine.checkpoint()
    return {"ends": ends, "applied": engine.applied, "fleet": engine.fleet.to_doc()}


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


def rebuild_sharded(
    log_dir: str | os.PathLike[str],
    store_path: str | os.PathLike[str],
    *,
    workers: int = 2,
    policy: RunStatePolicy | None = None,
    prices: Prices | None = None,
    commit_every: int = 20_000,
) -> dict[str, Any]:
    """Rebuild ``log_dir`` into the (new, empty) SQLite store at ``store_path``."""
    target = SqliteReadModel(store_path)
    if target.positions():
        raise ValueError(f"{store_path} already holds a projection; resume it single-process")
    target.close()
    policy, prices = policy or RunStatePolicy.load(), prices or Prices.load()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=Path(store_path).parent) as tmp:
        jobs = [
            (
                str(log_dir),
                i,
                workers,
                str(Path(tmp) / f"shard{i}.sqlite"),
                policy.model_dump_json(),
                prices.model_dump_json(),
                commit_every,
            )
            for i in range(workers)
        ]
        ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            results = list(pool.map(_shard, jobs))
        ends: dict[str, int] = {}
        for r in results:
            for topic, end in r["ends"].items():
                ends[topic] = max(ends.get(topic, 0), end)
        fleet = merge_fleets([r["fleet"] for r in results])
        con = sqlite3.connect(store_path, isolation_level=None)
        try:
            con.execute("BEGIN IMMEDIATE")
            for i, (_, _, _, path, *_rest) in enumerate(jobs):
                con.execute(f"ATTACH DATABASE ? AS s{i}", (path,))
                for table in ("runs", "series", "fold_state"):
                    con.execute(f"INSERT INTO main.{table} SELECT * FROM s{i}.{table}")
            con.execute("INSERT OR REPLACE INTO meta VALUES ('fleet', ?)", (_json(fleet.to_doc()),))
            con.execute("INSERT OR REPLACE INTO meta VALUES ('held', ?)", (_json({}),))
            con.executemany(
                "INSERT OR REPLACE INTO positions VALUES (?, ?)",
                [(f"{t}:0", end) for t, end in sorted(ends.items())],
            )
            con.execute("COMMIT")
            for i in range(len(jobs)):
                con.execute(f"DETACH DATABASE s{i}")
        finally:
            con.close()
    return {
        "records": sum(ends.values()),
        "applied": sum(r["applied"] for r in results),
        "workers": workers,
        "seconds": time.perf_counter() - started,
    }


def _json(doc: Any) -> str:
    import json

    return json.dumps(doc)
