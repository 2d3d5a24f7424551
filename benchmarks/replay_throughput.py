"""Replay throughput on the embedded log, as ratios to the codec's decode of the same events.

Builds an embedded log of a synthetic fleet (every scenario of tests/projection_runs.py:
lifecycle, telemetry, rewards, checkpoints, alerts; runs interleaved by event time), then
measures, in the same run and on the same records:

- anchor: decoding them with the codec (``events.codec.decode``: pydantic validation);
- beside it: reading the records (segment parsing + CRC) and the hosts' fast decoder
  (``events.fast_decode``: the same answers);
- the read model's replay into the in-memory model, one process (``runwatch.hosting.replay.
  rebuild_from_log``: read, decode, run-state and accounting folds, views) — the figure,
  goal >= 0.5x the anchor's rate;
- the replay of all folds (the processors' too: profiling, detectors, run controller,
  accounting) and the read model from one read, as ``runwatch replay`` runs it;
- the same into a SQLite read model, and again into that store (the no-op path);
- the key-sharded replay (``--workers`` 1, 2, ... up to the cores) into memory: its
  speed-up over one process, beside the anchor of what W forked processes of a pure-Python
  loop get from this box's cores (W loops in W processes against one loop in one).

Rates are events per CPU-second of this process and its children for the one-process
figures (what other jobs on a shared box disturb least), and events per wall-second for
the sharded ones (their point is the wall time). Every measurement runs with the cyclic
GC paused, as the replay itself does. Best of ``--repeat``.

Usage: python benchmarks/replay_throughput.py [--runs 120] [--steps 250] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events.codec import decode
from events.fast_decode import decode_fast
from events.log.embedded import EmbeddedLog
from projections.sqlite_store import SqliteReadModel
from runwatch.folds import processor_folds
from runwatch.hosting.read_model import INPUTS
from runwatch.hosting.replay import rebuild_from_log, replay_log
from tests.projection_runs import synth_fleet, write_log


def _cpu() -> float:
    """CPU seconds of this process and its (waited-for) children so far."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """Best-of-``repeat`` (wall seconds, CPU seconds, last result)."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        out = None
        gc.collect()
        gc.disable()
        try:
            t, c = time.perf_counter(), _cpu()
            out = fn()
            walls.append(time.perf_counter() - t)
            cpus.append(_cpu() - c)
        finally:
            gc.enable()
    return min(walls), min(cpus), out


def _loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def _spin(workers: int, n: int = 4_000_000) -> None:
    """The anchor of the sharded figures: ``workers`` pure-Python loops of ``n`` steps in
    ``workers`` forked processes (what this box's free cores give a CPU-bound process)."""
    import multiprocessing

    if workers == 1:
        _loop(n)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.map(_loop, [n] * workers)


def measure(root: Path, tmp: Path, repeat: int, workers: int) -> dict[str, Any]:
    """Every figure on the log at ``root``: CPU seconds one process, wall seconds sharded."""
    reader = EmbeddedLog(root, readonly=True)
    _, read_cpu, records = best(lambda: list(reader.iter_records(list(INPUTS))), repeat)
    values = [r.value for r in records]
    del records
    _, decode_cpu, _ = best(lambda: [decode(v) for v in values], repeat)
    _, fast_cpu, _ = best(lambda: [decode_fast(v) for v in values], repeat)
    _, mem_cpu, result = best(lambda: rebuild_from_log(root, collect=False), repeat)
    folds = processor_folds()
    _, all_cpu, _ = best(lambda: replay_log(root, processors=folds, collect=False), repeat)

    def to_sqlite() -> tuple[Any, Path]:
        path = tmp / f"p{time.perf_counter_ns()}.sqlite"
        return rebuild_from_log(root, SqliteReadModel(path), collect=False), path

    _, sql_cpu, (_, path) = best(to_sqlite, repeat)
    _, noop_cpu, noop = best(
        lambda: rebuild_from_log(root, SqliteReadModel(path), collect=False), 1
    )
    shards = []
    cores = [(w, best(lambda w=w: _spin(w), repeat)[0]) for w in range(1, max(1, workers) + 1)]
    for w in range(1, max(1, workers) + 1):
        wall, _, sharded = best(lambda w=w: replay_log(root, workers=w, collect=False), repeat)
        same = sharded.summary()["runs_by_state"] == result.summary()["runs_by_state"]
        shards.append((w, wall, same))
    return {
        "rows": [
            ("anchor: codec decode (pydantic)", decode_cpu),
            ("read records (no decode)", read_cpu),
            ("hosts' fast decode", fast_cpu),
            ("replay -> in-memory read model", mem_cpu),
            ("replay, all folds + read model", all_cpu),
            ("replay -> SQLite read model", sql_cpu),
            ("replay again into that SQLite (no-op)", noop_cpu),
        ],
        "shards": shards,
        "cores": dict(cores),
        "noop_applied": noop.host.view.applied,
    }


def report(n: int, m: dict[str, Any]) -> None:
    rows = dict(m["rows"])
    decode_cpu = rows["anchor: codec decode (pydantic)"]
    print(f"{'one process':40s} {'CPU s':>8s} {'ev/CPU-s':>10s} {'x anchor':>9s}")
    for name, cpu in m["rows"]:
        print(f"{name:40s} {cpu:8.3f} {n / cpu:10.0f} {decode_cpu / cpu:9.2f}")
    print(
        f"\n{'key-sharded, in memory':40s} {'wall s':>8s} {'ev/s':>10s} {'x 1 shard':>9s}"
        f" {'anchor: W loops in W processes, x 1':>37s}"
    )
    one, cores = m["shards"][0][1], m["cores"]
    for workers, wall, same in m["shards"]:
        name = f"{workers} worker{'s' if workers > 1 else ''} (same read model: {same})"
        anchor = workers * cores[1] / cores[workers]
        print(f"{name:40s} {wall:8.3f} {n / wall:10.0f} {one / wall:9.2f} {anchor:37.2f}")
    mem_cpu = rows["replay -> in-memory read model"]
    ratio, all_ratio = decode_cpu / mem_cpu, decode_cpu / rows["replay, all folds + read model"]
    print(
        f"\nfigure: read-model replay {n / mem_cpu:.0f} events/CPU-s = {ratio:.2f}x the codec "
        f"decode rate ({n / decode_cpu:.0f}/CPU-s) of the same events (goal >= 0.5x: "
        f"{'MET' if ratio >= 0.5 else 'NOT MET'}); all folds {all_ratio:.2f}x; "
        f"the no-op replay applied {m['noop_applied']}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=120)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="most shards")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "log"
        log = EmbeddedLog(root, sync=False)
        log.open_sync()
        events = synth_fleet(args.runs, args.steps)
        write_log(log, events)
        n = len(events)
        del events
        print(
            f"log: {n} events, {args.runs} runs x {args.steps} steps; "
            f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}"
        )
        m = measure(root, Path(tmp), args.repeat, args.workers)
    report(n, m)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
