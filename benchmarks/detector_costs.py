"""What the run-health fold costs per step event, by detector, and hosted: ratios to decode.

    python benchmarks/detector_costs.py [--events 30000] [--repeat 5]

Per core (CPU time of this process), on ``TrainerStepCompleted`` events with every metric
set (100 interleaved runs, as ``detector_throughput.py``):

- anchor: the codec's ``decode`` of the same events (what any host pays per record);
- the whole fold (every detector), and the fold with no detector (the composite's own
  work: ordering marks, dispatch, the run's state record);
- each detector's cost: the whole fold less the fold without that detector (its share of
  the composite's work, its state in the record, counts too);
- the fold hosted: the one host (``runwatch.hosting.host.Host``) over the encoded records
  (the hosts' fast decode, dedupe by event id, the fold).

Read with the goal of ``detector_throughput.py`` (fold >= 1.0x the decode): the fold
reaches it only if the composite plus its detectors cost no more than one decode.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.detector_throughput import decode_rate, fold_rate, step_events
from events.codec import encode
from stream_processors.detectors import RunHealthFold


def hosted_rate(events: list[Any]) -> float:
    """Records through the one host (fast decode, dedupe, fold), per CPU-second."""
    from events.log.base import Record
    from runwatch.hosting.host import Host
    from runwatch.hosting.stores import NoState

    records = [Record(type(e).TOPIC, 0, i, e.key(), encode(e), 0) for i, e in enumerate(events)]
    host = Host([RunHealthFold()], NoState())
    t0 = time.process_time()
    for i in range(0, len(records), 5000):
        host.process(records[i : i + 5000])
    return len(records) / (time.process_time() - t0)


def detector_costs(events: list[Any], repeat: int = 5) -> list[tuple[str, float]]:
    """Microseconds of CPU per step event that each detector costs the composite fold: the
    composite with every detector, less the composite without that one (so a detector's
    share of the composite's own work, its state in the run's record, counts too). The
    first row is the composite with no detector at all."""
    from stream_processors.detectors.registry import DETECTORS

    def us(detectors: tuple[Any, ...]) -> float:
        return min(1e6 / fold_rate(events, detectors)[0] for _ in range(repeat))

    full = us(tuple(DETECTORS))
    out = [("(all detectors)", full), ("(composite, no detector)", us(()))]
    for det in DETECTORS:
        out.append((det.name, full - us(tuple(d for d in DETECTORS if d is not det))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=30_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    steps = step_events(args.events)
    anchor_us = min(1e6 / decode_rate(steps) for _ in range(args.repeat))
    hosted_us = min(1e6 / hosted_rate(steps) for _ in range(args.repeat))
    print(f"{'per TrainerStepCompleted':34s} {'us/event':>9s} {'x decode':>9s}")
    print(f"{'anchor: codec decode':34s} {anchor_us:9.2f} {1:9.2f}")
    for name, us in detector_costs(steps, args.repeat):
        print(f"{name:34s} {us:9.2f} {us / anchor_us:9.2f}")
    print(f"{'(the fold hosted: decode + fold)':34s} {hosted_us:9.2f} {hosted_us / anchor_us:9.2f}")


if __name__ == "__main__":
    main()
