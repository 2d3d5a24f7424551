"""The telemetry side of the chaos test, in a process of its own.

Appends the events of ``--runs`` synthetic runs (every scenario of
:mod:`tests.projection_runs`, merged by event time as a live fleet) and of
``--fault-runs`` runs with a fault the detectors catch within a few steps
(:mod:`stream_processors.detectors.scenarios`), interleaved, through
:class:`KafkaLog` in chunks of ``--chunk`` records of one topic, pausing ``--pause``
seconds between chunks so the publishing spans the broker's kill and restart. After a
chunk is *acknowledged* its event ids are appended to ``--acked`` (flushed, fsynced),
so the test knows what the broker promised to keep. Exits 0 once every event is
acknowledged; "waited" lines say which chunks waited out an outage.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from events.codec import encode
from events.envelope import EventBase
from events.log.kafka import KafkaLog
from stream_processors.detectors.scenarios import synthetic_run
from tests.projection_runs import synth_fleet

#: Faults the detectors catch within a few steps of the onset (kl_blowup, staleness).
FAULTS = ("oversized_lr", "frozen_weight_sync")


def fleet(args: argparse.Namespace) -> list[EventBase]:
    """The runs' events, the fault runs spread evenly among the fleet's."""
    streams = [synth_fleet(args.runs, args.steps, t0=args.t0)] + [
        synthetic_run(
            200 + i, steps=80, fault=FAULTS[i % len(FAULTS)], fault_step=40, run_id=f"fault-{i}"
        )
        for i in range(args.fault_runs)
    ]
    placed = [(i / len(s), n, ev) for n, s in enumerate(streams) for i, ev in enumerate(s)]
    placed.sort(key=lambda x: (x[0], x[1]))
    return [ev.model_copy(update={"run_id": f"{args.prefix}-{ev.run_id}"}) for _, _, ev in placed]


async def produce(args: argparse.Namespace) -> int:
    events = fleet(args)
    chunks: list[list] = []
    for ev in events:  # consecutive events of one topic, at most --chunk of them
        last = chunks[-1] if chunks else None
        if last and type(last[0]).TOPIC == type(ev).TOPIC and len(last) < args.chunk:
            last.append(ev)
        else:
            chunks.append([ev])
    async with KafkaLog(args.bootstrap) as log:
        with open(args.acked, "a") as acked:
            for chunk in chunks:
                t0 = time.monotonic()
                topic = type(chunk[0]).TOPIC
                await log.append_many(topic, [(e.key(), encode(e)) for e in chunk])
                if (waited := time.monotonic() - t0) > 1.0:
                    print(f"a chunk waited {waited:.1f}s for its acks (broker away)", flush=True)
                acked.write("".join(f"{e.event_id}\n" for e in chunk))
                acked.flush()
                os.fsync(acked.fileno())
                await asyncio.sleep(args.pause)
    return len(events)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--acked", required=True)
    parser.add_argument("--prefix", required=True, help="prepended to every run id")
    parser.add_argument("--runs", type=int, default=14)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--fault-runs", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.02)
    parser.add_argument("--t0", type=float, default=1.8e9)
    args = parser.parse_args()
    started = time.monotonic()
    n = asyncio.run(produce(args))
    print(f"produced {n} events in {time.monotonic() - started:.1f}s", flush=True)


if __name__ == "__main__":
    main()
