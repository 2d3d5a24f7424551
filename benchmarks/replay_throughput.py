"""Replay throughput of the projections on the embedded log (goal: >= 100k events/s).

Builds an embedded log of a synthetic fleet (every scenario of tests/projection_runs.py:
lifecycle, telemetry, rewards, checkpoints, alerts; runs interleaved by event time), then
measures, in the same run and on the same records:

- anchor 1: reading the records back (segment parsing + CRC, no decoding);
- anchor 2: decoding them with the codec (pydantic validation, the floor of any replay);
- the full projection rebuild into the in-memory read model (decode + both folds + views);
- the same into a SQLite read model (views, series and offsets committed per batch);
- a second replay into that SQLite store (every record already applied: the no-op path);
- the key-sharded parallel rebuild (``projections/sharded.py``) with ``--workers`` processes.

Usage: python benchmarks/replay_throughput.py [--runs 120] [--steps 250] [--repeat 3]
Figures are best-of-``repeat`` (the box is shared; the best run is the least disturbed).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events.codec import decode
from events.log.embedded import EmbeddedLog
from projections.engine import INPUTS
from projections.replay import rebuild_from_log
from projections.sharded import rebuild_sharded
from projections.store import SqliteReadModel
from tests.projection_runs import synth_fleet, write_log


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=120)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "log"
        log = EmbeddedLog(root, sync=False)
        log.open_sync()
        t = time.perf_counter()
        events = synth_fleet(args.runs, args.steps)
        write_log(log, events)
        n = len(events)
        del events
        print(
            f"log: {n} events, {args.runs} runs x {args.steps} steps, built in "
            f"{time.perf_counter() - t:.1f}s; cpus={os.cpu_count()} "
            f"load={os.getloadavg()[0]:.1f}"
        )

        reader = EmbeddedLog(root, readonly=True)
        read_s, records = best(lambda: list(reader.iter_records(list(INPUTS))), args.repeat)
        values = [r.value for r in records]  # type: ignore[union-attr]
        decode_s, _ = best(lambda: [decode(v) for v in values], args.repeat)
        del records
        mem_s, result = best(lambda: rebuild_from_log(root, collect=False), args.repeat)

        def to_sqlite():
            path = Path(tmp) / f"p{time.perf_counter_ns()}.sqlite"
            return rebuild_from_log(root, SqliteReadModel(path), collect=False), path

        sql_s, (sql_result, path) = best(to_sqlite, args.repeat)
        noop_s, noop = best(lambda: rebuild_from_log(root, SqliteReadModel(path), collect=False), 1)

        def sharded():
            out = Path(tmp) / f"s{time.perf_counter_ns()}.sqlite"
            return rebuild_sharded(root, out, workers=args.workers)

        shard_s, _ = best(sharded, args.repeat)

    rows = [
        ("anchor: read records (no decode)", read_s),
        ("anchor: codec decode only", decode_s),
        ("replay -> in-memory read model", mem_s),
        ("replay -> SQLite read model", sql_s),
        ("replay again into same SQLite (no-op)", noop_s),
        (f"replay -> SQLite, {args.workers} key-sharded processes", shard_s),
    ]
    print(f"{'measurement':42s} {'seconds':>8s} {'events/s':>10s}")
    for name, secs in rows:
        print(f"{name:42s} {secs:8.3f} {n / secs:10.0f}")
    summary = result.summary()  # type: ignore[union-attr]
    print(
        f"runs by state: {summary['runs_by_state']}; SQLite replay applied "
        f"{sql_result.engine.applied}, the repeated replay applied {noop.engine.applied}"
    )
    goal = 100_000
    rate = n / mem_s
    print(
        f"goal >= {goal} events/s (in-memory replay): {'MET' if rate >= goal else 'NOT MET'} "
        f"({rate:.0f}/s; codec-only ceiling on this box {n / decode_s:.0f}/s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
