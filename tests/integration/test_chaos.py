"""Chaos in CI time (issue 19): the whole Kafka plane under three kinds of crash at once.

On a JVM broker of its own, real processes run as in a deployment: the faust worker
(``runwatch process --kafka``), the projection follower (``runwatch serve api --kafka``
into its SQLite store), the trajectory API (``runwatch serve trajectories --kafka``),
a telemetry producer (:mod:`tests.integration.chaos_producer`: synthetic runs of every
scenario, each chunk's ids written down once acknowledged) and rollout pushers that
retry every push with its ``Idempotency-Key`` until they get a 200. Then, in turn:

1. the broker is SIGKILLed mid-publish and restarted on the same ports and data dir;
2. the trajectory server is killed (kill -9) twice mid-push and restarted;
3. the faust worker is killed (kill -9) mid-stream and restarted at once.

Asserted afterwards: every acknowledged event is on the log exactly once; every
acknowledged rollout group is served by ``/batch`` exactly once; the detectors derived
the same alerts (ids included) as the embedded host derives offline from what the log
holds, and nothing beyond re-derivations of the same ids; the worker resumed within
:data:`RESUME_BOUND_S` of its kill (a probe published after the kill got its alert); the
follower's live projection equals an offline replay (``runwatch audit verify``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from events.catalog.trainer import TrainerStepCompleted
from events.codec import decode, encode
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from events.log.kafka import KafkaLog
from events.topics import TOPICS
from runwatch.broker.jvm import JvmBroker
from runwatch.folds import processor_folds
from runwatch.hosting.embedded import EmbeddedHost
from tests.integration.test_trajectory_processes import REGISTRATION, Server, get_batch
from tests.integration.test_trajectory_retries import GROUPS_PER_PUSH, KeyedPusher, Tally

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
PRODUCER = Path(__file__).with_name("chaos_producer.py")
#: kill -9 of the worker -> its replacement's first derived event. The goal (issue 16) is
#: 10 s, measured by benchmarks/worker_recovery.py (3.5-4.5 s on a quiet 2-core box); here
#: the broker, four Python servers, the producer and the pushers share the 2 cores (16 s
#: was seen with other jobs on the box too), so the bound is 30 s: still half of the
#: 60 s session stall (57-101 s measured) it guards against.
RESUME_BOUND_S = 30.0
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A ``runwatch`` CLI process in its own process group, its output in a file."""

    def __init__(self, name: str, args: list[str], tmp: Path) -> None:
        self.name, self.args, self.tmp = name, args, tmp
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> Proc:
        self.starts += 1
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        with open(self.tmp / f"{self.name}-{self.starts}.log", "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runwatch.cli.main", *self.args],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> float:
        assert self.proc is not None
        t = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return t

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def log_tail(self) -> str:
        return (self.tmp / f"{self.name}-{self.starts}.log").read_text(errors="replace")[-3000:]


def probe(run_id: str) -> bytes:
    """A first trainer step with a NaN loss: the NaN detector answers it at once."""
    ev = TrainerStepCompleted(
        event_id=uuid.uuid4(), tenant_id="chaos", run_id=run_id, step=0, ts=time.time(),
        producer="chaos-probe", seq=0, loss=math.nan,
    )  # fmt: skip
    return encode(ev)


async def _first_probe_alert(bootstrap: str, prefix: str, timeout_s: float) -> float:
    """Publish a probe (a new run each) every 0.25 s until one's AlertFired is read back;
    when that was (monotonic)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await producer.start()
    await consumer.start()
    try:
        await at_end(consumer, "runwatch.alerts")
        deadline, n = time.monotonic() + timeout_s, 0
        while time.monotonic() < deadline:
            n += 1
            run_id = f"{prefix}-{n}"
            await producer.send_and_wait("runwatch.telemetry", probe(run_id), run_id.encode())
            for records in (await consumer.getmany(timeout_ms=250)).values():
                for rec in records:
                    ev = decode(rec.value)
                    if getattr(ev, "type", "") == "AlertFired" and ev.run_id.startswith(prefix):
                        return time.monotonic()
        raise AssertionError(f"no probe alert within {timeout_s:.0f} s")
    finally:
        await consumer.stop()
        await producer.stop()


async def at_end(consumer: Any, topic: str) -> None:
    """Assign every partition of ``topic``, each positioned at its end now."""
    from aiokafka import TopicPartition

    from events.topics import spec

    tps = [TopicPartition(topic, p) for p in range(spec(topic).partitions)]
    consumer.assign(tps)
    ends = await consumer.end_offsets(tps)
    for tp in tps:
        consumer.seek(tp, ends[tp])


def first_probe_alert(bootstrap: str, prefix: str, timeout_s: float) -> float:
    return asyncio.run(_first_probe_alert(bootstrap, prefix, timeout_s))


async def _read_all(bootstrap: str) -> dict[str, list[EventBase]]:
    """Every decodable event on every registry topic, per topic in partition order."""
    out: dict[str, list[EventBase]] = {}
    async with KafkaLog(bootstrap, create_registry_topics=False) as log:
        for topic in TOPICS:
            for partition in await log.partitions(topic):
                async for rec in log.read(topic, partition):
                    ev = decode(rec.value)
                    if isinstance(ev, EventBase):
                        out.setdefault(topic, []).append(ev)
    return out


async def create_topics(bootstrap: str) -> None:
    async with KafkaLog(bootstrap):
        pass


def acked_ids(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line] if path.exists() else []


def wait_for(what: str, check: object, timeout_s: float, every_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}")


def offline_alerts(events: dict[str, list[EventBase]], acked: list[str], root: Path) -> set[str]:
    """The ids of what the detectors derive, hosted by the embedded host over the input
    events as the log holds them, in the order the producer published them (``acked``:
    the acknowledged ids, chunk by chunk).

    Publishing order, not topic by topic: the run-health fold reads four topics
    (lifecycle, telemetry, checkpoints, rewards) and judges a checkpoint's lateness
    against the telemetry's steps, so an oracle that folded every telemetry record before
    any checkpoint would page a run whose checkpoints were on time. A live consumer sees
    each topic in its partitions' order and the topics interleaved about as published."""
    by_id = {str(e.event_id): e for evs in events.values() for e in evs}
    ordered, seen = [], set()
    for i in acked:  # a chunk re-sent after an outage is listed twice: its first place
        if i in by_id and i not in seen:
            seen.add(i)
            ordered.append(by_id[i])
    log = EmbeddedLog(root, sync=False)
    log.open_sync()
    log.append_events_sync(ordered)  # stamped in this order across topics
    EmbeddedHost(log, processor_folds()).run_once()
    return {
        str(decoded.event_id)
        for r in log.read_sync("runwatch.alerts")
        if isinstance(decoded := decode(r.value), EventBase) and decoded.producer == "run-health"
    }


def test_chaos_broker_worker_and_trajectory_kills(jvm_broker: JvmBroker, tmp_path: Path) -> None:
    bootstrap, tag = jvm_broker.bootstrap, uuid.uuid4().hex[:8]
    asyncio.run(create_topics(bootstrap))  # registry topics before any process starts
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"key": "ops", "operator": True}]}))
    store, api_port = tmp_path / "live.sqlite", free_port()
    worker = Proc("worker", ["process", "--kafka", bootstrap, "--app-id", f"chaos-{tag}"], tmp_path)
    follower = Proc("follower", [
        "serve", "api", "--kafka", bootstrap, "--store", str(store), "--keys", str(keys),
        "--port", str(api_port), "--settle-s", "0.5",
    ], tmp_path)  # fmt: skip
    traj = Server(free_port(), ["--kafka", bootstrap], "api-a", f"chaos-{tag}-rollouts", tmp_path)
    acked_file = tmp_path / "acked.txt"
    tally = Tally()
    pushers = [KeyedPusher(i, traj.url, tally, pause_s=0.05) for i in range(3)]
    producer = None
    procs = [worker, follower]
    try:
        worker.start()
        follower.start()
        traj.start()
        httpx.post(traj.url + "/register", json=REGISTRATION).raise_for_status()
        first_probe_alert(bootstrap, f"chaos-{tag}-warm", timeout_s=180)  # the worker is up
        with open(tmp_path / "producer.log", "wb") as out:
            producer = subprocess.Popen(
                [sys.executable, str(PRODUCER), f"--bootstrap={bootstrap}",
                 f"--acked={acked_file}", f"--prefix=chaos-{tag}", "--pause=0.08"],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        for p in pushers:
            p.deadline = time.monotonic() + 400
            p.start()

        # 1. the broker dies mid-publish and comes back on the same ports and data dir
        wait_for("500 acknowledged events", lambda: len(acked_ids(acked_file)) >= 500, 120)
        jvm_broker.kill()
        at_kill = len(acked_ids(acked_file))
        time.sleep(1.0)
        jvm_broker.restart()
        wait_for("publishing again", lambda: len(acked_ids(acked_file)) > at_kill + 100, 180)

        # 2. the trajectory server dies mid-push, twice; the pushers retry with their keys
        for _ in range(2):
            time.sleep(0.7)
            traj.kill9()
            time.sleep(0.2)
            traj.start()

        # 3. the worker dies mid-stream and is restarted at once
        assert producer.poll() is None, "the telemetry must still flow when the worker dies"
        t_kill = worker.kill9()
        worker.start()
        resumed_s = first_probe_alert(bootstrap, f"chaos-{tag}-probe", 120) - t_kill

        assert producer.wait(300) == 0, (tmp_path / "producer.log").read_text()[-2000:]
        for p in pushers:
            p.halt.set()
        for p in pushers:
            p.join(120)
        assert not tally.unacked and all(not p.is_alive() for p in pushers)
        served: Counter[int] = Counter()
        with httpx.Client(timeout=10) as client:
            deadline = time.monotonic() + 120
            while not tally.acked <= set(served) and time.monotonic() < deadline:
                got = get_batch(client, traj.url)
                served.update(got or [])
                time.sleep(0 if got else 0.05)

        # the follower settles: every synthetic run reached its terminal state
        runs = {f"chaos-{tag}-run-{i:04d}" for i in range(14)}
        ops = {"Authorization": "Bearer ops"}

        def settled() -> bool:
            try:
                states = [
                    httpx.get(f"http://127.0.0.1:{api_port}/v1/operator/runs/{r}", headers=ops)
                    for r in runs
                ]
            except httpx.HTTPError:
                return False
            return all(
                r.status_code == 200 and r.json()["run"]["state"] in TERMINAL for r in states
            )

        wait_for("the live projection to settle", settled, 180, every_s=1.0)
        time.sleep(3.0)  # (late derived events: the probes' alerts, controller requests)
        assert worker.alive() and follower.alive(), worker.log_tail() + follower.log_tail()
    finally:
        for p in pushers:
            p.halt.set()
        if producer is not None and producer.poll() is None:
            producer.kill()
            producer.wait()
        for proc in procs:
            proc.stop()
        traj.stop()

    # -- the log: every acknowledged event exactly once --------------------------------------
    acked = acked_ids(acked_file)
    events = asyncio.run(_read_all(bootstrap))
    on_log = Counter(str(e.event_id) for evs in events.values() for e in evs)
    lost = [i for i in acked if not on_log[i]]
    doubled = [i for i in acked if on_log[i] > 1]
    assert not lost and not doubled, (len(lost), len(doubled))

    # -- rollouts: every acknowledged group served exactly once ------------------------------
    twice = {m: n for m, n in served.items() if n > 1}
    assert not twice and set(served) == tally.acked, (twice, tally.acked - set(served))

    # -- the detectors: the live alerts are the offline ones (ids), re-derivations aside ---
    inputs = set(acked)
    produced_runs = {e.run_id for evs in events.values() for e in evs if str(e.event_id) in inputs}
    live = Counter(
        str(e.event_id)
        for e in events.get("runwatch.alerts", [])
        if e.producer == "run-health" and e.run_id in produced_runs
    )
    offline = offline_alerts(events, acked, tmp_path / "offline")
    assert len(offline) >= 4  # every fault run fires
    assert set(live) == offline, (set(live) - offline, offline - set(live))
    assert resumed_s <= RESUME_BOUND_S, f"processing resumed {resumed_s:.1f} s after the kill"

    # -- the projection: live == an offline replay ------------------------------------------
    verify = subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", "audit", "verify", "--store", str(store),
         "--kafka", bootstrap, "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
    assert json.loads(verify.stdout)["identical"], verify.stdout[-2000:]
    print(
        f"\nchaos: {len(acked)} events acknowledged (broker SIGKILLed at {at_kill}), "
        f"0 lost, 0 duplicated on the log; rollouts: {tally.attempts} push attempts, "
        f"{len(tally.acked) // GROUPS_PER_PUSH} pushes acknowledged ({tally.retried_pushes} "
        f"after a retry, {tally.replayed} replayed), {sum(served.values())} groups served "
        f"once each; detectors: {len(offline)} alerts as offline, "
        f"{sum(live.values()) - len(live)} re-derived (same id); worker resumed "
        f"{resumed_s:.1f} s after kill -9; live projection == replay"
    )
