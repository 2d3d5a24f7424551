"""A producer in a process of its own, for the broker crash test.

Appends ``--total`` real encoded events to ``--topic`` through :class:`KafkaLog` in
chunks of ``--chunk`` (``append_many``), pausing ``--pause`` seconds between chunks so
the run spans a broker kill and restart. After each chunk is *acknowledged* it appends
the chunk's event ids to ``--acked`` (one per line, flushed and fsynced), so the test
knows exactly what the broker promised to keep. Exits 0 once every event is acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from events.catalog.trainer import TrainerStepCompleted
from events.codec import encode
from events.envelope import new_envelope
from events.log.kafka import KafkaLog


async def produce(args: argparse.Namespace) -> None:
    async with KafkaLog(args.bootstrap, create_registry_topics=False) as log:
        with open(args.acked, "a") as acked:
            seq = 0
            while seq < args.total:
                chunk = []
                for _ in range(min(args.chunk, args.total - seq)):
                    run_id = f"run-{seq % args.runs}"
                    env = new_envelope(
                        tenant_id="t", run_id=run_id, producer="crash", seq=seq, step=seq
                    )
                    chunk.append(TrainerStepCompleted(**env, loss=1.0 / (seq + 1)))
                    seq += 1
                t0 = time.monotonic()
                await log.append_many(args.topic, [(e.key(), encode(e)) for e in chunk])
                if (waited := time.monotonic() - t0) > 1.0:
                    print(f"a chunk waited {waited:.1f}s for its acks (broker away)", flush=True)
                acked.write("".join(f"{e.event_id}\n" for e in chunk))
                acked.flush()
                os.fsync(acked.fileno())
                await asyncio.sleep(args.pause)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--acked", required=True)
    parser.add_argument("--total", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument("--runs", type=int, default=17)
    parser.add_argument("--pause", type=float, default=0.02)
    args = parser.parse_args()
    started = time.monotonic()
    asyncio.run(produce(args))
    print(f"produced {args.total} events in {time.monotonic() - started:.1f}s", flush=True)


if __name__ == "__main__":
    main()
