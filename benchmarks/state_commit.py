"""What one commit of the embedded processors' fold states costs, against how many runs
they hold: a commit after one run's new event, with ``--runs`` other runs' states kept.

    python benchmarks/state_commit.py [--runs 50000] [--commits 20]

Anchor (same process, same disk): the same commit when the folds hold one run. Before the
journal (``runwatch/hosting/state_journal.py``) a commit rewrote every run's state, so its
cost grew with the runs ever seen (red-team round four: 630 ms at 50,000 one-event runs
of one tenant, for every tenant's commits); now it writes what changed. Prints wall ms
per commit (fsync'd, as ``runwatch process`` commits) for both and their ratio.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events import UsageRecorded
from events.log.embedded import EmbeddedLog
from runwatch.folds import processor_folds
from runwatch.hosting.host import Host
from runwatch.hosting.stores import StateFiles
from tests.event_samples import sample


def _usage(run: str, i: int) -> UsageRecorded:
    ev = sample(UsageRecorded, i, run_id=run)
    return ev.model_copy(update={"event_id": uuid.uuid4(), "seq": i})  # type: ignore[return-value]


def commit_ms(runs: int, commits: int) -> float:
    """Median wall ms of a commit after one new event, with ``runs`` runs held."""
    with tempfile.TemporaryDirectory() as tmp:
        log = EmbeddedLog(Path(tmp) / "log")
        log.open_sync()
        host = Host(processor_folds(), StateFiles(log))
        host.process_events(("runwatch.telemetry", 0, _usage(f"r{i}", 0)) for i in range(runs))
        host.checkpoint()
        times = []
        for n in range(1, commits + 1):
            host.process_events([("runwatch.telemetry", 0, _usage("r0", n))])
            t0 = time.perf_counter()
            host.checkpoint()
            times.append(time.perf_counter() - t0)
        times.sort()
        return times[len(times) // 2] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50_000)
    ap.add_argument("--commits", type=int, default=20)
    args = ap.parse_args()
    anchor = commit_ms(1, args.commits)
    many = commit_ms(args.runs, args.commits)
    print(f"commit, folds holding 1 run (anchor): {anchor:8.2f} ms")
    print(f"commit, folds holding {args.runs} runs:   {many:8.2f} ms")
    print(f"ratio: {many / anchor:.2f}x")


if __name__ == "__main__":
    main()
