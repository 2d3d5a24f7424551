"""What a record costs the read model's replay, part by part: ratios to the codec's decode.

    python benchmarks/replay_costs.py [--runs 60] [--steps 250] [--repeat 3]

On the replay benchmark's synthetic fleet (``tests/projection_runs.py``), in CPU µs per
record of this process, best of ``--repeat``, the cyclic GC paused (as the replay pauses
it):

- anchor: the codec's ``decode`` of the records (what ``replay_throughput.py`` divides by);
- read: the log's merged read of the read model's topics (segment parse, CRC, merge), on
  a log already open (the open's own scan is part of the whole replay, last row);
- the hosts' fast decode;
- the read model's host (``runwatch.hosting.read_model``) over the records already read
  and decoded, one part added at a time: its folds (run state, accounting) alone, then
  the terminal barrier, then the view, then the commit;
- the whole replay (``rebuild_from_log``: open, read, decode, the host, commits).

Read with the goal of ``replay_throughput.py`` (the replay >= 0.5x the decode's rate): the
whole replay may then cost two decodes.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events.codec import decode
from events.fast_decode import decode_many
from events.log.embedded import EmbeddedLog
from runwatch.hosting.barrier import TerminalBarrier
from runwatch.hosting.host import Host
from runwatch.hosting.read_model import INPUTS
from runwatch.hosting.replay import rebuild_from_log
from runwatch.hosting.stores import ReadModelState
from tests.projection_runs import synth_fleet, write_log


def cpu_seconds(fn: Callable[[], Any], repeat: int) -> float:
    """Best-of-``repeat`` CPU seconds of ``fn()``, the cyclic GC paused."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t0 = time.process_time()
            fn()
            best = min(best, time.process_time() - t0)
        finally:
            gc.enable()
    return best


def host_parts(records: list[Any], events: list[Any], repeat: int) -> list[tuple[str, float]]:
    """CPU seconds of the read model's host over decoded records, one option at a time."""
    from projections.materializer import Materializer
    from projections.store import InMemoryReadModel
    from runwatch.folds import projection_folds

    def run(barrier: bool, view: bool, commit: bool) -> None:
        host = Host(
            projection_folds(),
            ReadModelState(InMemoryReadModel()),
            barrier=TerminalBarrier() if barrier else None,
            view=Materializer if view else None,
        )
        host.process_decoded(*host.accept(records, events))
        host.release_held(force=True)
        if commit:
            host.checkpoint()

    return [
        (
            "host: run-state + accounting folds",
            cpu_seconds(lambda: run(False, False, False), repeat),
        ),
        ("  + terminal barrier", cpu_seconds(lambda: run(True, False, False), repeat)),
        ("  + view", cpu_seconds(lambda: run(True, True, False), repeat)),
        ("  + commit (in memory)", cpu_seconds(lambda: run(True, True, True), repeat)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "log"
        log = EmbeddedLog(root, sync=False)
        log.open_sync()
        write_log(log, synth_fleet(args.runs, args.steps))
        reader = EmbeddedLog(root, readonly=True)
        topics = sorted(INPUTS)

        def read() -> list[Any]:
            chunks = reader.merged_chunks(topics, dict.fromkeys(topics, 0))
            return [item[3] for chunk in chunks for item in chunk]

        records = read()
        values = [r.value for r in records]
        events = decode_many(values)
        n = len(records)
        rows = [
            ("anchor: codec decode", cpu_seconds(lambda: [decode(v) for v in values], args.repeat)),
            ("read (log already open)", cpu_seconds(read, args.repeat)),
            ("hosts' fast decode", cpu_seconds(lambda: decode_many(values), args.repeat)),
            *host_parts(records, events, args.repeat),
            (
                "whole replay (rebuild_from_log)",
                cpu_seconds(lambda: rebuild_from_log(root, collect=False), args.repeat),
            ),
        ]
    anchor = rows[0][1]
    print(f"{n} records, {args.runs} runs x {args.steps} steps")
    print(f"{'part':38s} {'us/record':>10s} {'x decode':>9s}")
    for name, seconds in rows:
        print(f"{name:38s} {seconds / n * 1e6:10.2f} {seconds / anchor:9.2f}")


if __name__ == "__main__":
    main()
