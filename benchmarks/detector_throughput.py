"""Detector throughput and latency.

    python benchmarks/detector_throughput.py [--kafka HOST:PORT] [--probes 200] [--skip-kafka]

1. Fold throughput, per core (CPU time of this process, so other load on the box does
   not count against it): ``RunHealthFold.apply`` over ``TrainerStepCompleted`` events
   with every metric set (100 interleaved runs), and over full mixed telemetry (synthetic
   runs: steps, rollouts, phases, usage, syncs, evals, checkpoints). Anchor, same run:
   the codec's ``decode`` of the same step events — what any host pays per record before
   a fold sees it; each figure is printed as its ratio to the anchor (goal for the fold:
   >= 1.0x). What each detector costs, and the fold hosted: ``detector_costs.py``.
2. publish -> AlertFired latency on a real broker: a ``runwatch process --kafka`` worker
   (the faust app, its own process) runs; background telemetry of healthy runs streams
   at ``--rate`` events/s while ``--probes`` probe events (a first step with a NaN loss,
   each for a new run) are published one at a time; latency = the probe's AlertFired
   read back from ``runwatch.alerts`` minus the moment its send started. Anchor, same
   run: publish -> consume round trip of a plain record on the same broker.
   Without ``--kafka`` a broker is provisioned (``runwatch.broker.provision``: env, then
   testcontainers, then the JVM broker from Maven jars) and stopped afterwards.

Writes ``--out`` (default ``stream_processors/detectors/PERFORMANCE.md``) and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from events import TrainerStepCompleted
from events.codec import decode, encode
from stream_processors.detectors import RunHealthFold, load_catalog
from stream_processors.detectors.scenarios import synthetic_run

OUT = Path(__file__).resolve().parents[1] / "stream_processors" / "detectors" / "PERFORMANCE.md"


def step_events(n: int, runs: int = 100) -> list[TrainerStepCompleted]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        run, step = i % runs, i // runs
        out.append(
            TrainerStepCompleted(
                event_id=uuid.UUID(int=i + 1),
                tenant_id="bench",
                run_id=f"bench-{run}",
                step=step,
                ts=1.8e9 + i,
                producer="bench",
                seq=step,
                reward_mean=0.5 + 0.001 * step + rng.normal(0, 0.02),
                reward_std=0.3,
                kl_to_ref=0.02 + rng.normal(0, 0.002),
                entropy=1.0 - 0.0005 * step + rng.normal(0, 0.02),
                grad_norm=float(np.exp(rng.normal(0, 0.2))),
                grad_clip_threshold=5.0,
                clip_fraction=0.01,
                loss=0.1,
                lr=1e-6,
            )
        )
    return out


def fold_rate(events: list[Any], detectors: Any = None) -> tuple[float, int]:
    """``detectors``: a subset of them (the packaged catalog's thresholds); None: all."""
    fold = RunHealthFold() if detectors is None else RunHealthFold(load_catalog(), detectors)
    states: dict[str, Any] = {}
    derived = 0
    t0 = time.process_time()
    for ev in events:
        state = states.get(ev.run_id)
        if state is None:
            state = fold.initial()
        states[ev.run_id], out = fold.apply(state, ev)
        derived += len(out)
    return len(events) / (time.process_time() - t0), derived


def decode_rate(events: list[Any]) -> float:
    raws = [encode(e) for e in events]
    t0 = time.process_time()
    for raw in raws:
        decode(raw)
    return len(raws) / (time.process_time() - t0)


# -- latency on the broker ------------------------------------------------------------


async def _latency(bootstrap: str, probes: int, rate: float) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from events.log.kafka import KafkaLog

    async with KafkaLog(bootstrap):
        pass  # registry topics exist
    tag = uuid.uuid4().hex[:8]
    log = Path(f"/tmp/rw-bench-worker-{tag}.log")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runwatch.cli.main",
            "process",
            "--kafka",
            bootstrap,
            "--app-id",
            f"rw-bench-{tag}",
        ],
        stdout=open(log, "wb"),  # noqa: SIM115  (closed with the process)
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    consumer = AIOKafkaConsumer(
        "runwatch.alerts", bootstrap_servers=bootstrap, auto_offset_reset="latest"
    )
    await producer.start()
    await consumer.start()
    seen: dict[str, float] = {}

    async def reader() -> None:
        while True:
            batch = await consumer.getmany(timeout_ms=100)
            now = time.perf_counter()
            for records in batch.values():
                for rec in records:
                    ev = decode(rec.value)
                    if getattr(ev, "type", "") == "AlertFired":
                        seen.setdefault(ev.run_id, now)

    def probe(run_id: str) -> bytes:
        ev = TrainerStepCompleted(
            event_id=uuid.uuid4(), tenant_id="bench", run_id=run_id, step=0,
            ts=time.time(), producer="bench", seq=0, loss=math.nan,
        )  # fmt: skip
        return encode(ev)

    # generated up front: building events must not stall this loop (and the reader)
    load = [
        (type(ev).TOPIC, encode(ev), ev.key())
        for seed in range(int(rate * 60 / 1200) + 1)
        for ev in synthetic_run(seed, steps=200, run_id=f"bg-{tag}-{seed}")
    ]

    async def background(stop: asyncio.Event) -> int:
        sent, interval = 0, 1.0 / rate
        for topic, value, key in load:
            if stop.is_set():
                break
            await producer.send(topic, value, key=key)
            sent += 1
            await asyncio.sleep(interval)
        return sent

    read_task = asyncio.create_task(reader())
    try:
        deadline = time.monotonic() + 180  # the worker joins its group, restores tables
        n = 0
        while not any(r.startswith("warmup-") for r in seen) and time.monotonic() < deadline:
            n += 1  # a new run each time: an open NaN episode would not fire again
            warm = f"warmup-{tag}-{n}"
            await producer.send_and_wait("runwatch.telemetry", probe(warm), warm.encode())
            await asyncio.sleep(2.0)
        if not any(r.startswith("warmup-") for r in seen):
            raise RuntimeError(f"the faust worker produced no alert within 180 s (log: {log})")
        stop = asyncio.Event()
        bg_started = time.perf_counter()
        bg = asyncio.create_task(background(stop))
        sent_at: dict[str, float] = {}
        for i in range(probes):
            run_id = f"probe-{tag}-{i}"
            sent_at[run_id] = time.perf_counter()
            await producer.send_and_wait("runwatch.telemetry", probe(run_id), run_id.encode())
            await asyncio.sleep(0.05)
        wait_until = time.monotonic() + 30
        while time.monotonic() < wait_until and not all(r in seen for r in sent_at):
            await asyncio.sleep(0.1)
        stop.set()
        bg_sent = await bg
        bg_rate = bg_sent / (time.perf_counter() - bg_started)
        lat = [seen[r] - t for r, t in sent_at.items() if r in seen]
        # anchor: plain publish -> consume round trip on the same broker
        anchor_topic = "runwatch.lifecycle"
        rt = AIOKafkaConsumer(anchor_topic, bootstrap_servers=bootstrap, auto_offset_reset="latest")
        await rt.start()
        await rt.getmany(timeout_ms=500)
        trips = []
        for _ in range(50):
            marker = uuid.uuid4().bytes
            t0 = time.perf_counter()
            await producer.send_and_wait(anchor_topic, b"{}", key=marker)
            got = False
            while not got:
                for records in (await rt.getmany(timeout_ms=100)).values():
                    got = got or any(r.key == marker for r in records)
            trips.append(time.perf_counter() - t0)
        await rt.stop()
    finally:
        read_task.cancel()
        with contextlib.suppress(BaseException):
            await read_task
        await consumer.stop()
        await producer.stop()
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
    return {
        "probes": probes,
        "answered": len(lat),
        "p50_ms": 1000 * float(np.percentile(lat, 50)) if lat else math.nan,
        "p99_ms": 1000 * float(np.percentile(lat, 99)) if lat else math.nan,
        "max_ms": 1000 * max(lat) if lat else math.nan,
        "background_events": bg_sent,
        "background_rate": bg_rate,
        "anchor_p50_ms": 1000 * float(np.percentile(trips, 50)),
        "anchor_p99_ms": 1000 * float(np.percentile(trips, 99)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kafka", help="bootstrap of a running broker (default: provision one)")
    ap.add_argument("--skip-kafka", action="store_true", help="fold throughput only")
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--rate", type=float, default=500.0, help="background events/s")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    steps = step_events(args.events)
    mixed = [e for seed in range(40) for e in synthetic_run(seed, steps=400)]
    step_rate, step_derived = fold_rate(steps)
    mixed_rate, _ = fold_rate(mixed)
    anchor = decode_rate(steps[:20_000])
    lines = [
        "# Run-health detectors: measured performance",
        "",
        "Generated by `python benchmarks/detector_throughput.py` "
        f"(python {sys.version.split()[0]}, {os.cpu_count()} cores shared with other work; "
        "rates are per core: events / CPU-second of the folding process).",
        "",
        "| figure | value | anchor (same run) |",
        "| --- | ---: | --- |",
        f"| fold throughput, TrainerStepCompleted (all metrics, 100 runs) | "
        f"{step_rate:,.0f} events/s/core = **{step_rate / anchor:.2f}x** the anchor | "
        f"codec decode of the same events: {anchor:,.0f} events/s/core; goal >= 1.0x |",
        f"| fold throughput, mixed telemetry ({len(mixed):,} events, 40 runs) | "
        f"{mixed_rate:,.0f} events/s/core | goal >= 100,000 step events/s/core |",
    ]
    print(f"fold: {step_rate:,.0f} step events/s/core ({step_derived} alerts) = "
          f"{step_rate / anchor:.2f}x the codec decode ({anchor:,.0f}/s, goal >= 1.0x); "
          f"mixed {mixed_rate:,.0f}/s")  # fmt: skip
    if not args.skip_kafka:
        broker = None
        bootstrap = args.kafka
        if bootstrap is None:
            from runwatch.broker.provision import provision

            broker = provision(log=print)
            bootstrap = broker.bootstrap
            print(f"using Kafka broker {broker.describe()}")
        try:
            lat = asyncio.run(_latency(bootstrap, args.probes, args.rate))
        finally:
            if broker is not None:
                broker.stop()
        print(lat)
        lines.append(
            f"| publish -> AlertFired latency, faust worker on a real broker "
            f"({lat['answered']}/{lat['probes']} probes, {lat['background_rate']:.0f} background "
            f"events/s) | "
            f"p50 {lat['p50_ms']:.0f} ms, p99 {lat['p99_ms']:.0f} ms (max {lat['max_ms']:.0f}) "
            f"| publish -> consume round trip: p50 {lat['anchor_p50_ms']:.0f} ms, "
            f"p99 {lat['anchor_p99_ms']:.0f} ms; goal p99 < 1 s |"
        )
    text = "\n".join([*lines, ""])
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
